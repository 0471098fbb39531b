"""The in-pod driver of lmeval-poller.

Why this package exists: the job pod has no Kubernetes API rights, so the
driver is what turns a raw ``lm_eval`` process into a record the poller can
trust: it runs lm_eval as a child, forwards its output with forgeries
defused, writes ``::lmeval::`` markers (see :mod:`driver.protocol`) and exits
with a meaningful code. It uses only the standard library and imports neither
``kubernetes`` nor ``poller``, so it can be copied into any image that has
Python and lm_eval.
"""

__version__ = "0.1.0"
