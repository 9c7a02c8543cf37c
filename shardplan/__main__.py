import sys

from shardplan.cli.app import main

sys.exit(main())
