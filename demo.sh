#!/bin/sh
# Set up (a .venv beside this file) and run gpuwatch on its demo fleet.
set -eu
cd "$(dirname "$0")"
. scripts/setup.sh
setup_venv
exec .venv/bin/gpuwatch --demo "$@"
