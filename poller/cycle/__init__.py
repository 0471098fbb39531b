"""One polling cycle: observe everything the decisions need, decide once per job, act.

Rule: this is where I/O meets the decisions. Each cycle first reads (the
``observe`` half, through ``poller.kube``), then calls the pure
``poller.decisions.decide`` once per job, then carries the actions out (the
``act`` half); nothing here decides what to do for a job. What the poller
remembers between cycles lives here too, bounded.

* ``reconciler``: one cycle over the jobs that can change (observe, decide, act);
* ``observe``: the reads a cycle makes before it decides; ``act``: the actions, through `Kube`;
* ``sweep``: the finished jobs, the slow half of the cycle, its cost bounded;
* ``statuswrites``: a job's status and events, written only when they change;
* ``podproof``: the keyed proof that a pod is the one the poller made;
* ``podio``: a job pod's log and files read (bounded), and the pod actions that exec;
* ``tasksnapshot``: custom-task ConfigMaps checked for code, then frozen;
* ``poison``: bounded retries when handling one job keeps failing;
* ``retained``, ``jobseries``: what is kept of each finished job between sweeps;
* ``suites``: the LMEvalSuites' half of a cycle, after the jobs.
"""
