"""``lmeval``: the command line for people who submit and follow evaluations.

Installed as ``lmeval`` and as ``kubectl-lmeval`` (so ``kubectl lmeval ...``
works). Module map: ``__main__`` (commands, flags, exit), ``kubeconfig``
(context and namespace as kubectl finds them), ``client`` (the API calls, a
job looked up by the name a person typed, and the one read of the objects
that belong to a job, which refuses any the job does not control),
``errors`` (actionable messages, exit codes), ``submit`` (flags or a file to
a validated LMEvalJob), ``commands`` (submit, list, get, results, compare,
cancel, suspend, resume, delete), ``selection`` (names or ``-l`` as
kubectl), ``output`` (the one ``-o`` vocabulary: json, yaml, name, wide,
jsonpath, custom-columns), ``follow`` (logs and wait, by polling),
``waitfor`` (``--for`` and ``--timeout``), ``watch`` (``-w``), ``completion``
(shell completion), ``version`` (the client's, the cluster's and the
poller's versions), ``facts`` (facts about a job), ``render`` (tables
and formats), ``suites`` (``suite list``, ``get``, ``run`` and ``verify``:
LMEvalSuites), ``suiteview`` (facts and tables of a suite) and
``suiteverify`` (a suite's signed verdicts checked with its public key). See
README.md beside this file.
"""
