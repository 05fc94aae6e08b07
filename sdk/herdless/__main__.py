"""``python -m herdless`` is the ``herdless`` command."""

import sys

from herdless.cli import main

sys.exit(main())
