import sys

from shardplan.cli import main

sys.exit(main())
