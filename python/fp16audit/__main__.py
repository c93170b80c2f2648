"""`python -m fp16audit ARGS` runs the fp16audit binary the package carries, as the `fp16audit` command does."""

import sys

from ._binary import exec_binary

if __name__ == "__main__":
    exec_binary(sys.argv[1:])
