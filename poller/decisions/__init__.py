"""What to do for each job: pure functions from what a cycle observed to actions.

Rule: pure. Nothing here does I/O, reads a clock or imports the I/O layer:
the views of what was observed come in (``views``), the actions go out
(``actions``), so every transition is a table-driven unit test. `decide`
returns frozen data and is called once per job per cycle.

* ``views``: frozen views of what a cycle observed (jobs, pods, a log window, results);
* ``observed``: `Observed`, everything one job's decision reads, in one object;
* ``actions``: what a decision asks to read first, and the actions it returns;
* ``decide``: one job's decision; ``routing``: which branch it takes;
* ``scheduling``: how a job gets its pod (made, adopted, or queued for a slot);
* ``shards``: a sharded job's shard pods (spec.parallelism), before its merge pod;
* ``concurrency``: who may start under ``max-running-jobs``, and who waits;
* ``kueueadmission``: Kueue's admission of a job's Workload;
* ``outcome``: how a finished evaluation's outcome is read;
* ``regression``: the regression gate's verdict (``spec.baseline``, ``spec.gate``);
* ``draft``: the next status, drafted field by field;
* ``ownership``: whether a pod is the job's own;
* ``taskcode``: where a custom-task ConfigMap would make lm_eval run code;
* ``suites``: an LMEvalSuite's decision: triggers, baseline, verdict, history.
"""
