"""What an evaluation produced, read and judged: pure functions over untrusted text.

Rule: pure, and bounded. Nothing here does I/O; every input (a results JSON, a
log's per-item scores, a pod's provenance) was written by the job's author, so
each reader has a named bound and a clear refusal. Only ``poller.api`` and the
driver's contract (``driver.protocol``) are imported.

* ``lmeval``: lm_eval's results JSON, reduced for the status and kept whole in the
  job's results ConfigMap; the scores read out of it once;
* ``itemstore``: a run's per-item scores, checked once, counted and stored;
* ``provenance``: what identifies a run, read from its pod, its log and its results;
* ``pairedstats``: the paired comparison of two runs over the same documents;
* ``power``: how large a drop a paired comparison of n documents can see;
* ``suiteverdict``: a suite run's criteria judged against its baseline, then the whole.
"""
