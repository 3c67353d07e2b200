# Sourced by demo.sh, test.sh and .ci/run: a fresh Debian machine with only Python and apt.

_apt_install() {
    # Install Debian packages as root, or through sudo when it asks for no password.
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
    else
        echo "setup: please install these Debian packages first: $*" >&2
        return 1
    fi
}

setup_sshd() {
    # The integration tests start a real OpenSSH sshd on loopback (it is not left running).
    if [ ! -x /usr/sbin/sshd ]; then
        echo "setup: installing openssh-server (the tests run a real sshd on 127.0.0.1)" >&2
        _apt_install openssh-server openssh-client
    fi
    command -v tmux >/dev/null 2>&1 || _apt_install tmux || true
}

setup_slurm() {
    # The Slurm tests start a real Slurm on this machine (munge, MariaDB, slurmdbd, slurmctld,
    # slurmd; tests/harness/slurm.py), none of it left running and nothing under /etc used.
    # About a minute to install on Debian 12 (Slurm 22.05).
    for tool in slurmctld slurmd slurmdbd sbatch sacct munged mariadbd mariadb-install-db; do
        if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
            echo "setup: installing Slurm, munge and MariaDB (the Slurm tests run a real one)" >&2
            _apt_install --no-install-recommends slurmctld slurmd slurm-client slurmdbd munge \
                mariadb-server
            return
        fi
    done
}

setup_venv() {
    # .venv with gpuwatch installed editable; `test` adds the test extra.
    py=${PYTHON:-python3}
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "setup: gpuwatch needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
        return 1
    fi
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv 2>/dev/null || { _apt_install python3-venv && "$py" -m venv .venv; }
    fi
    extra=""
    [ "${1:-}" = test ] && extra="[test]"
    stamp=".venv/.installed$extra"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        .venv/bin/python -m pip install -q --upgrade pip >/dev/null
        .venv/bin/python -m pip install -q -e ".$extra"
        touch "$stamp"
    fi
}
