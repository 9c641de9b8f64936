"""What both the commands without a daemon and those on the hosts print: `commands` loads
`live` only when a command reaches the hosts, and `live` needs this much of it."""

from __future__ import annotations

from sparkd.model.plan import Plan


def render_plan(result: Plan) -> str:
    state = "converged" if result.converged else "not converged"
    lines = [f"{result.cluster}: {result.phase} ({state}): {result.reason}"]
    for number, action in enumerate(result.actions, 1):
        lines.append(f"  {number}. {action.kind} {action.target} on {action.host}: {action.reason}")
    for action in result.withheld:
        lines.append(f"  -  {action.kind} {action.target} on {action.host} (withheld)")
    if not result.actions and not result.withheld:
        lines.append("  nothing to do")
    return "\n".join(lines)
