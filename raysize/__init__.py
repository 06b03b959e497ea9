"""raysize: in-place resize and scale-out of Ray clusters on Kubernetes, as Temporal workflows.

Everything raysize installs lives under this one name. The code itself sits in the
repository's top-level folders; ``raysize/<name>`` is a symbolic link to each of them, so
``raysize.workflows`` is ``workflows/``, ``raysize.activities`` is ``activities/``,
``raysize.worker`` is ``worker/`` and ``raysize.sandbox`` (the stand-in Kubernetes of the
demo and the tests; never imported by the worker) is ``sandbox/``. Import them by these
names only: the bare top-level names are not installed.
"""

__version__ = "0.2.0"
