"""The job pod's manifest, built piece by piece from a job's spec and the settings.

Rule: pure. Nothing here does I/O or imports the I/O layer: a pod is a
function of the job and the settings, so every piece is a unit test. Strings
reach a process only as argv lists (never a shell) or as environment values,
held to the API's patterns first.

* ``podspec``: the whole pod (containers, volumes, labels, the driver's options);
* ``argv``: lm_eval's command line and the main container's resources;
* ``modeltls``: TLS to the model endpoint (``spec.modelTLS``);
* ``trust``: what every TLS client of the pod trusts: the cluster's CA bundles
  (setting ``trusted-ca-bundles``), each endpoint's ``caBundle``, and the
  ``verifySSL`` gate of storage endpoints;
* ``gittasks``: task files from Git: the init containers that clone them;
* ``offline``: models and datasets from storage (``spec.offline``);
* ``ocioutput``: results pushed to an OCI registry (``spec.outputs.oci``);
* ``mlflowoutput``: the evaluation logged to MLflow (``spec.outputs.mlflow``);
* ``signer``: the pod that signs a suite's verdict (an LMEvalSuite's ``spec.attestation``).
"""
