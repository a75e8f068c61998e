import os
import sys

from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# The same examples on every run and no deadline: a CI run must not pass or fail by chance (a shared
# machine's pause of 200 ms failed a property test's default deadline). HYPOTHESIS_PROFILE=explore
# draws new examples each run, for hunting locally.
settings.register_profile("repeatable", deadline=None, derandomize=True, database=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
