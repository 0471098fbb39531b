"""The I/O layer: the only package of the operator that talks to the Kubernetes API.

Rule: nothing outside this package opens a connection or sends a request; the
packages below it (``decisions``, ``jobpod``, ``results``, ``api``) never import
it. Inside, each module is one step of a request, top to bottom:

* ``client``: `Kube`, the reads with the writes (create, patch, delete, exec), each
  write guarded by a precondition;
* ``reads``: every read, and the one counted request every call goes through;
* ``pages``: LIST pages parsed in one pass into what the views read;
* ``transport``: urllib3 for REST, a WebSocket for exec (no ``kubernetes`` package);
* ``config``: where the connection settings and credentials come from;
* ``errors``: the apiserver's errors as typed exceptions (the CLI and the sandbox
  meet the same ones).
"""
