"""An order job's work on the cluster when no keeper was alive to read it (``orders.main``)."""

import sys

from .orders import main

sys.exit(main())
