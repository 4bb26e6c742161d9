"""The entry point of each process ``memlab launch`` starts: ``python -m memlab.app.worker VERB ...``.

It ties the process to its launcher (:func:`memlab.app.launched.tie_to_launcher`: it ends, and writes nothing
more, as soon as the launcher is gone, whatever signal ended it, ``kill -9`` included), then runs the verb as
``memlab VERB ...`` would (:func:`memlab.app.cli.main`).
"""

from __future__ import annotations

import sys

from memlab.app.launched import tie_to_launcher

if __name__ == "__main__":
    tie_to_launcher()
    from memlab.app.cli import main

    sys.exit(main())
