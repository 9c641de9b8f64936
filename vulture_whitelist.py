"""Names vulture reports as unused that are used where it cannot see: by a library through a
protocol or hook, by a document's readers, or by the tests that drive the simulator.
`make lint` runs vulture over the packages with this file beside them (pyproject [tool.vulture]).
Each entry says why it stays; a name that is simply unused is removed, not listed here.
"""

# ruff: noqa: B018
# mypy: ignore-errors

_ = object()

# Fields of the public snapshot document (docs/snapshot.md): written for its readers and the
# replay, not read by sparkd itself.
_.sub_state
_.memory_total_bytes
_.reused
_.http_status
_.snapshot_version
# A kernel event's first line's time, for the snapshot's readers (its last is what sparkd reads).
_.first_at
# RE2's option, read by the library when it compiles (sparkd.model.linear_regex).
_.log_errors
# A parsed known_hosts line keeps the key as OpenSSH wrote it; lookups go by `hosts`.
_.blob

# A config key kept for old configs, no longer used (CHANGELOG): config keys are an interface.
_.budget_window
# pydantic-settings' hook: called by BaseSettings with these keyword names.
_.settings_customise_sources
_.dotenv_settings
_.file_secret_settings

# prometheus_client calls a registered collector's `collect()`.
_.collect
# asyncio's transport and protocol interfaces, called by the event loop and asyncssh.
_.is_reading
_.datatype
# aiohttp's BaseSite reads `_bound_port` for the site's name (web/app.py sets it on its own
# site, binding the socket itself).
_._bound_port
# The triage classes' table: read by test_triage and by the plan's triage field's docs.
_.TABLE

# Read by tests only, as the state they check, where the alternative is reaching into private
# fields: whether an SSH connection is open, and the next scheduled maintenance opening.
_.connected
_.next_opening
# The etcd client's API for the HA work (issue 22), exercised by tests/etcd.
_.delete
_.watch_deletes

# asyncssh.SSHServer hooks, called by asyncssh with these argument names.
_.begin_auth
_.password_auth_supported
_.public_key_auth_supported
_.validate_public_key
_.connection_requested
_.orig_host
_.orig_port
# tarfile reads a member's `linkname` when writing a symlink.
_.linkname
# The simulator's surface for tests and bench (tests/sim, tests/sshd, tests/realdocker,
# tests/etcd, bench/bench_probe.py): what a test asks the simulated world.
_.send_query
_.ensure_login_user
_.stop_daemon
_.leftovers
_.owned_commands
_.prompt_tokens_total
_.head_container_id
_.delayed
_.subscribed
# `World._serve_on`: the model server a test kills or prompts directly (tests/sim, tests/e2e).
_._serve_on

# Unused, in modules being moved or split by concern this round (sparkd/sim, web/app.py): to
# be removed where they land, not edited under the move.
_.started_in
_._crash
_._crash_rc
_.expired
# The controller's answer to "when is the next look" without running a cycle: what the horizon
# tests and the time-invariant machine ask (the loop takes the same `next_look` with its reason).
_.next_delay
# The executor's action handlers: called by the name their kind's row gives
# (sparkd.shell.catalogue.kinds.ACTIONS); a test checks every row names one.
_._stop_unit
_._remove_container
_._prune_cache
_._kill_gpu_process
_._power_cycle
