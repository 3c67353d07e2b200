#!/bin/sh
# Set up (openssh-server via apt when missing, a .venv with the test extra) and run the tests.
set -eu
cd "$(dirname "$0")"
. scripts/setup.sh
setup_sshd
setup_venv test
exec .venv/bin/python -m pytest "$@"
