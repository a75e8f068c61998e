"""``python -m torch_dataloader_utils``: the ``tdu`` command line."""

import sys

from .cli import main

sys.exit(main())
