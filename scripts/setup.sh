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

setup_prometheus() {
    # The Prometheus source's integration tests start a real Prometheus on 127.0.0.1 with a
    # config of their own (it is not left running). Debian's package would start its own
    # service on :9090 at install: a policy-rc.d that denies it, for the install only, unless
    # the machine has one already (a container usually does).
    if [ -x /usr/bin/prometheus ] || command -v prometheus >/dev/null 2>&1; then
        return 0
    fi
    echo "setup: installing prometheus (the tests start one on 127.0.0.1; its own service" \
         "is not started)" >&2
    as_root=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            as_root="sudo -n"
        else
            echo "setup: please install prometheus without starting its service (as root:" \
                 "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; chmod +x" \
                 "/usr/sbin/policy-rc.d; apt-get install --no-install-recommends prometheus)" >&2
            return 1
        fi
    fi
    added=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $as_root tee /usr/sbin/policy-rc.d >/dev/null &&
            $as_root chmod 755 /usr/sbin/policy-rc.d && added=1
    fi
    status=0
    _apt_install --no-install-recommends prometheus || status=$?
    if [ -n "$added" ]; then
        $as_root rm -f /usr/sbin/policy-rc.d
    fi
    return $status
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
