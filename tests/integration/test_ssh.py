"""remote/wire/ssh.py against a real sshd: results, and every fault ending within its bound."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpuwatch.remote.wire.ssh import (
    ExecResult,
    SshBounds,
    SshError,
    Target,
    endpoint_keys,
    keepalive_bound_s,
    kept_endpoint_keys,
    parse_target,
    run_once,
)
from harness.captures import missing
from harness.faults import (
    change_host_key,
    frozen_sessions,
    hanging_standin,
    silent_port,
    wrong_client_key,
)
from harness.sshd import SshdBox, free_port, key_fingerprint, require_ssh
from harness.waiting import wait_for

# Small bounds keep the suite fast; only the fault deadlines are asserted, as upper bounds.
FAST = SshBounds(
    connect_timeout=2.0, server_alive_interval=0.5, server_alive_count_max=2, command_timeout=10.0
)
SLACK_S = 1.0


async def call(box: SshdBox, command: str, stdin: bytes = b"", **kwargs: Any) -> ExecResult:
    """run_once against the box through its ssh_config alias and known_hosts."""
    options: dict[str, Any] = {
        "bounds": FAST,
        "config_file": box.ssh_config,
        "known_hosts": box.known_hosts,
    }
    options.update(kwargs)
    return await run_once(options.pop("target", box.alias), command, stdin, **options)


async def fails(kind: str, call_: Any) -> tuple[SshError, float]:
    """Await call_, expect SshError of kind; return it and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(SshError) as info:
        await call_
    elapsed = time.monotonic() - start
    assert info.value.kind == kind, info.value.message
    return info.value, elapsed


# --------------------------------------------------------------------------------------------
# Results


@pytest.mark.asyncio
async def test_stdin_in_stdout_out(sshd_box: SshdBox) -> None:
    payload = os.urandom(300_000)
    result = await call(sshd_box, "cat", payload)
    assert result.stdout == payload
    assert (result.exit_status, result.exit_signal, result.stderr) == (0, None, b"")
    assert result.ok and not result.stdout_truncated and not result.stderr_truncated
    assert result.bytes_sent == len(payload) + len("cat")
    assert result.bytes_received == len(payload)
    assert result.connect_s > 0 and result.exec_s > 0
    assert result.connect_s + result.exec_s <= result.total_s


@pytest.mark.asyncio
async def test_exit_status_and_stderr_are_a_result_not_an_error(sshd_box: SshdBox) -> None:
    result = await call(sshd_box, "echo out; echo oops >&2; exit 7")
    assert (result.exit_status, result.stdout, result.stderr) == (7, b"out\n", b"oops\n")
    assert not result.ok


@pytest.mark.asyncio
async def test_a_command_gone_before_its_stdin_is_a_result(sshd_box: SshdBox,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing interpreter: the shell exits 127 before the probe could be fed, and the
    channel is closed by the time stdin is written. That is the command's answer (exit 127),
    not a dropped connection (CI saw it as one under load)."""
    import asyncssh

    create = asyncssh.SSHClientConnection.create_session

    async def late(self: Any, *args: Any, **kwargs: Any) -> Any:
        opened = await create(self, *args, **kwargs)
        await asyncio.sleep(0.5)  # the command has exited and its channel closed meanwhile
        return opened

    monkeypatch.setattr(asyncssh.SSHClientConnection, "create_session", late)
    result = await call(sshd_box, "exit 127", os.urandom(50_000))
    assert result.exit_status == 127 and result.stdout == b""


@pytest.mark.asyncio
async def test_death_by_signal(sshd_box: SshdBox) -> None:
    result = await call(sshd_box, "kill -KILL $$")
    assert (result.exit_status, result.exit_signal) == (None, "KILL")


@pytest.mark.asyncio
async def test_user_host_port_target_with_explicit_identity(sshd_box: SshdBox) -> None:
    empty_config = sshd_box.root / "empty_config"
    empty_config.write_text("")
    target = f"{sshd_box.user}@127.0.0.1:{sshd_box.port}"
    result = await call(
        sshd_box, "echo direct", target=target, config_file=empty_config,
        identity_file=sshd_box.client_key,
    )
    assert result.stdout == b"direct\n"


@pytest.mark.asyncio
async def test_proxyjump_from_the_ssh_config(sshd_box: SshdBox) -> None:
    sshd_box.add_host("behind", ProxyJump=sshd_box.alias)
    result = await call(sshd_box, "echo $SSH_CONNECTION", target="behind")
    assert result.exit_status == 0
    # The last hop came from the jump host (sshd itself, on loopback), not from us directly.
    assert result.stdout.split()[-1] == str(sshd_box.port).encode()


@pytest.mark.asyncio
async def test_a_connection_starts_from_the_parsed_config_not_a_new_reading(
    sshd_box: SshdBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asyncssh reads the whole ssh config on every connection (9 ms of client CPU
    per poll with 51 hosts in it); the connection starts from the reading ssh._parsed keeps
    (keys, agent, known_hosts and bounds still apply: the tests around this one). A ProxyJump
    target still has its file read, for asyncssh's jump connection."""
    import asyncssh

    reads: list[Path] = []
    parse = asyncssh.config.SSHConfig.parse

    def counted(self: Any, path: Path) -> None:
        reads.append(path)
        parse(self, path)

    monkeypatch.setattr(asyncssh.config.SSHConfig, "parse", counted)
    await call(sshd_box, "true")  # the first: _parsed reads the file
    reads.clear()
    assert (await call(sshd_box, "echo again")).stdout == b"again\n"
    assert reads == []
    sshd_box.add_host("behind", ProxyJump=sshd_box.alias)
    await call(sshd_box, "true", target="behind")
    reads.clear()
    assert (await call(sshd_box, "echo jumped", target="behind")).stdout == b"jumped\n"
    assert reads  # the jump host's connection read it


@pytest.fixture
def ssh_agent(sshd_box: SshdBox) -> Iterator[Path]:
    """A real ssh-agent holding the box's client key; yields its socket."""
    agent_bin = Path(require_ssh()).with_name("ssh-agent")
    add_bin = Path(require_ssh()).with_name("ssh-add")
    if not (agent_bin.exists() and add_bin.exists()):
        missing("ssh-agent/ssh-add are not installed (apt-get install openssh-client)")
    sock = sshd_box.root / "agent.sock"
    agent = subprocess.Popen([str(agent_bin), "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, what="ssh-agent's socket")
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run([str(add_bin), "-q", str(sshd_box.client_key)], env=env, check=True)
        yield sock
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.asyncio
async def test_ssh_agent_is_used_when_ssh_auth_sock_is_set(
    sshd_box: SshdBox, ssh_agent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This alias's IdentityFile does not exist (skipped, as OpenSSH does): only the agent has
    # the key.
    sshd_box.add_host("agentbox", IdentityFile=str(sshd_box.root / "absent"), IdentitiesOnly="no")
    monkeypatch.setenv("SSH_AUTH_SOCK", str(ssh_agent))
    result = await call(sshd_box, "echo agent", target="agentbox")
    assert result.stdout == b"agent\n"
    monkeypatch.delenv("SSH_AUTH_SOCK")
    error, _ = await fails("auth", call(sshd_box, "true", target="agentbox"))
    assert not error.retryable


@pytest.mark.asyncio
async def test_fleet_fan_out_below_max_startups(sshd_box: SshdBox) -> None:
    aliases = sshd_box.fleet(8)
    results = await asyncio.gather(*(call(sshd_box, "echo ok", target=a) for a in aliases))
    assert [r.stdout for r in results] == [b"ok\n"] * 8


@pytest.mark.asyncio
async def test_opening_is_held_only_until_logged_in(sshd_box: SshdBox) -> None:
    held: list[tuple[str, float]] = []

    @contextlib.asynccontextmanager
    async def opening() -> AsyncIterator[None]:
        held.append(("enter", time.monotonic()))
        yield
        held.append(("exit", time.monotonic()))

    result = await call(sshd_box, "sleep 0.3", opening=opening())
    done = time.monotonic()
    assert [what for what, _ in held] == ["enter", "exit"]
    assert held[1][1] <= done - result.exec_s + 0.01  # released before the command ran


def test_endpoint_keys_resolve_aliases_and_jumps(sshd_box: SshdBox) -> None:
    cfg = sshd_box.ssh_config
    port = sshd_box.port
    sshd_box.fleet(2)
    sshd_box.add_host("behind", ProxyJump=f"{sshd_box.alias},gpu2")
    key = f"127.0.0.1:{port}"
    assert endpoint_keys("gpu1", cfg) == endpoint_keys("gpu2", cfg) == [key]
    assert endpoint_keys(f"me@127.0.0.1:{port}", cfg) == [key]
    assert endpoint_keys("other.example:2200", cfg) == ["other.example:2200"]
    assert endpoint_keys("behind", cfg) == [key, key, key]


def test_kept_endpoint_keys_only_from_a_kept_reading(sshd_box: SshdBox) -> None:
    """The event loop's way to the limiter's keys: from the kept reading of the ssh config, or
    None where the file must be read (in a thread then); a changed file is read again."""
    cfg = sshd_box.ssh_config
    key = f"127.0.0.1:{sshd_box.port}"
    sshd_box.add_host("fresh1")
    assert kept_endpoint_keys("fresh1", cfg) is None
    assert endpoint_keys("fresh1", cfg) == [key]
    assert kept_endpoint_keys("fresh1", cfg) == [key]
    sshd_box.add_host("fresh2")  # the file changed: its kept readings no longer hold
    assert kept_endpoint_keys("fresh1", cfg) is None


@pytest.mark.asyncio
async def test_known_hosts_are_parsed_again_only_when_a_file_changes(
    sshd_box: SshdBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncssh

    loads: list[str] = []
    load = asyncssh.SSHKnownHosts.load

    def counted(self: Any, text: str) -> None:
        loads.append(text)
        load(self, text)

    monkeypatch.setattr(asyncssh.SSHKnownHosts, "load", counted)
    known = sshd_box.root / "kept_known_hosts"
    known.write_text(sshd_box.known_hosts.read_text())
    await call(sshd_box, "true", known_hosts=known)
    first = len(loads)
    assert (await call(sshd_box, "echo again", known_hosts=known)).stdout == b"again\n"
    assert len(loads) == first  # the same reading of the same files: not parsed again
    known.write_text("# a comment\n" + known.read_text())
    assert (await call(sshd_box, "true", known_hosts=known)).exit_status == 0
    assert len(loads) > first


# --------------------------------------------------------------------------------------------
# The fault matrix: each ends within its bound, with the right kind


@pytest.mark.asyncio
async def test_connection_refused_is_unreachable(sshd_box: SshdBox) -> None:
    port = free_port()
    error, elapsed = await fails(
        "unreachable", call(sshd_box, "true", target=f"127.0.0.1:{port}")
    )
    assert "refused" in error.message and error.retryable
    assert elapsed < FAST.connect_timeout


@pytest.mark.asyncio
async def test_unresolvable_host_is_unreachable(sshd_box: SshdBox) -> None:
    error, _ = await fails("unreachable", call(sshd_box, "true", target="no-such-host.invalid"))
    assert "no-such-host.invalid" in error.message


@pytest.mark.asyncio
async def test_silent_port_times_out_within_connect_timeout(sshd_box: SshdBox) -> None:
    with silent_port() as port:
        error, elapsed = await fails("timeout", call(sshd_box, "true", target=f"127.0.0.1:{port}"))
    assert elapsed < FAST.connect_timeout + SLACK_S
    assert "connect_timeout (2 s)" in error.message and error.retryable


@pytest.mark.asyncio
async def test_session_frozen_after_login_ends_within_the_keepalive_bound(
    sshd_box: SshdBox,
) -> None:
    marker = sshd_box.root / "logged-in"
    bounds = SshBounds(connect_timeout=2, server_alive_interval=0.5, server_alive_count_max=2,
                       command_timeout=60)
    hanging_standin(sshd_box.bin_dir, "hang")  # unlike `sleep`, it leaves with its session
    task = asyncio.ensure_future(call(sshd_box, f"touch {marker}; hang", bounds=bounds))
    for _ in range(500):
        if marker.exists():
            break
        await asyncio.sleep(0.01)
    assert marker.exists(), "the command never started"
    with frozen_sessions(sshd_box):
        error, elapsed = await fails("timeout", task)
    assert elapsed < keepalive_bound_s(bounds) + SLACK_S
    assert "keepalive" in error.message and "1.5 s" in error.message


@pytest.mark.asyncio
async def test_hung_command_ends_within_command_timeout(sshd_box: SshdBox) -> None:
    hanging_standin(sshd_box.bin_dir, "hung-probe")
    bounds = SshBounds(connect_timeout=2, server_alive_interval=0.5, server_alive_count_max=2,
                       command_timeout=1.5)
    error, elapsed = await fails("timeout", call(sshd_box, "hung-probe", bounds=bounds))
    assert elapsed < FAST.connect_timeout + bounds.command_timeout + SLACK_S
    assert "command_timeout (1.5 s)" in error.message and error.retryable


@pytest.mark.asyncio
async def test_max_startups_drops_are_unreachable_and_retryable(
    sshd_factory: Callable[..., SshdBox],
) -> None:
    box = sshd_factory(max_startups="2:100:2")  # sshd drops every login past 2 at a time
    aliases = box.fleet(10)
    results = await asyncio.gather(
        *(call(box, "true", target=a) for a in aliases), return_exceptions=True
    )
    dropped = [r for r in results if isinstance(r, SshError)]
    assert dropped and len(dropped) < len(results)
    assert all(e.kind == "unreachable" and e.retryable for e in dropped)
    assert all("MaxStartups" in e.message for e in dropped)


@pytest.mark.asyncio
async def test_wrong_key_is_auth(sshd_box: SshdBox) -> None:
    wrong = wrong_client_key(sshd_box)
    error, _ = await fails("auth", call(sshd_box, "true", identity_file=wrong))
    assert f"'{sshd_box.user}'" in error.message and str(wrong) in error.message
    assert "authorized_keys" in error.message and not error.retryable


@pytest.mark.asyncio
async def test_unknown_host_key_refused_then_accepted_and_recorded(sshd_box: SshdBox) -> None:
    known = sshd_box.root / "fresh" / "known_hosts"  # does not exist yet, nor its folder
    fingerprint = key_fingerprint(sshd_box.host_key)

    error, _ = await fails("host_key", call(sshd_box, "true", known_hosts=known))
    assert fingerprint in error.message
    # The fix names the same config and known_hosts, so running it records the key there.
    fix = f"ssh -F {sshd_box.ssh_config} -o UserKnownHostsFile={known} {sshd_box.alias}"
    assert f"`{fix}`" in error.message
    assert "--accept-new-host-keys" in error.message and not error.retryable
    assert not known.exists()

    result = await call(sshd_box, "echo hi", known_hosts=known, accept_new_host_keys=True)
    assert result.stdout == b"hi\n"
    lines = known.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[127.0.0.1]:{sshd_box.port} ssh-ed25519 ")
    assert oct(known.stat().st_mode & 0o777) == "0o600"

    # Now known: strict again, and OpenSSH reads the entry we wrote.
    assert (await call(sshd_box, "true", known_hosts=known)).exit_status == 0
    done = sshd_box.ssh("true", options=[f"UserKnownHostsFile={known}"])
    assert done.returncode == 0, done.stderr
    assert len(known.read_text().splitlines()) == 1


@pytest.mark.asyncio
async def test_accept_new_writes_hashed_entries_into_a_hashed_file(sshd_box: SshdBox) -> None:
    known = sshd_box.root / "hashed_known_hosts"
    known.write_text(sshd_box.known_hosts.read_text().replace("[127.0.0.1]", "[10.9.9.9]"))
    await asyncio.to_thread(
        subprocess.run, ["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True
    )
    assert known.read_text().startswith("|1|")

    await call(sshd_box, "true", known_hosts=known, accept_new_host_keys=True)
    added = known.read_text().splitlines()[-1]
    assert added.startswith("|1|") and "127.0.0.1" not in added
    found = await asyncio.to_thread(
        subprocess.run,
        ["ssh-keygen", "-F", f"[127.0.0.1]:{sshd_box.port}", "-f", str(known)],
        capture_output=True, text=True, check=False,
    )
    assert found.returncode == 0 and "ssh-ed25519" in found.stdout


@pytest.mark.asyncio
async def test_changed_host_key_refused_even_with_accept_new(sshd_box: SshdBox) -> None:
    before = sshd_box.known_hosts.read_text()
    new_fingerprint = change_host_key(sshd_box)
    for accept_new in (False, True):
        error, _ = await fails(
            "host_key", call(sshd_box, "true", accept_new_host_keys=accept_new)
        )
        assert "CHANGED" in error.message and new_fingerprint in error.message
        assert f"{sshd_box.known_hosts} line 1" in error.message
        assert not error.retryable
    assert sshd_box.known_hosts.read_text() == before


@pytest.mark.asyncio
async def test_ten_megabytes_of_garbage_are_bounded(sshd_box: SshdBox) -> None:
    cap = 1024 * 1024
    tracemalloc.start()
    try:
        result = await call(sshd_box, "head -c 10485760 /dev/urandom", max_stdout=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.stdout_truncated and len(result.stdout) == cap
    assert result.exit_status is None and not result.ok
    # The cap plus asyncssh's packet buffers and our final copy, far below 10 MB.
    assert peak < 4 * cap, f"peak {peak} bytes"


@pytest.mark.asyncio
async def test_stderr_past_its_cap_is_dropped_and_the_command_finishes(sshd_box: SshdBox) -> None:
    result = await call(
        sshd_box, "head -c 1000000 /dev/zero >&2; echo done", max_stderr=1000
    )
    assert result.stderr_truncated and len(result.stderr) == 1000
    assert (result.exit_status, result.stdout) == (0, b"done\n")
    assert result.bytes_received == 1000000 + 5


@pytest.mark.asyncio
async def test_config_errors(sshd_box: SshdBox) -> None:
    error, _ = await fails("config", call(sshd_box, "true", config_file="/nonexistent/ssh_config"))
    assert "/nonexistent/ssh_config" in error.message
    error, _ = await fails("config", call(sshd_box, "true", identity_file="/nonexistent/key"))
    assert "/nonexistent/key" in error.message
    await fails("config", call(sshd_box, "true", target="user@"))


# --------------------------------------------------------------------------------------------
# Pure parts


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("gpu1", Target("gpu1")),
        ("alice@gpu1", Target("gpu1", user="alice")),
        ("gpu1:2222", Target("gpu1", port=2222)),
        ("alice@10.0.0.5:2222", Target("10.0.0.5", user="alice", port=2222)),
        ("[fe80::1]:2200", Target("fe80::1", port=2200)),
        ("bob@[::1]:22", Target("::1", user="bob", port=22)),
        ("[::1]", Target("::1")),
        ("::1", Target("::1")),
    ],
)
def test_parse_target(text: str, target: Target) -> None:
    assert parse_target(text) == target


@pytest.mark.parametrize(
    "text", ["", "@gpu1", "gpu1:0", "gpu1:99999", "gpu1:ssh", "[::1", "[::1]x"]
)
def test_parse_target_rejects(text: str) -> None:
    with pytest.raises(SshError) as info:
        parse_target(text)
    assert info.value.kind == "config"


def test_retryable_by_kind() -> None:
    retryable = {k: SshError(k, "m").retryable
                 for k in ("unreachable", "timeout", "auth", "host_key", "probe", "config")}
    assert retryable == {"unreachable": True, "timeout": True, "auth": False,
                         "host_key": False, "probe": False, "config": False}


def test_keepalive_bound() -> None:
    assert keepalive_bound_s(SshBounds(server_alive_interval=5, server_alive_count_max=3)) == 20
