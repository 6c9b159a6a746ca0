"""The examples each help page ends with, by command path: one table, so that a test can check
every command has some and that each still parses against the command it illustrates."""

from __future__ import annotations

from typing import Any

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "": [
        ("shipyard quickstart", "train a small model here and sample from it"),
        ("shipyard spec example pretrain -o job.yaml", "a job spec to start from"),
        ("shipyard jobs submit job.yaml --wait", "queue a job and follow it to the end"),
        ("shipyard plan compare --params 8e9", "which accelerator trains an 8 B model most cheaply"),
    ],
    "devices": [("shipyard devices --json", "this node's accelerators, as jobs name them")],
    "version": [("shipyard version", "the installed version")],
    "nodes": [("shipyard nodes", "every node of the cluster: devices used, health, its jobs")],
    "generate": [
        ('shipyard generate tiny-code-model --prompt "def "', "a completion from the newest version"),
        ('shipyard generate assistant:3 -p "Hello" --temperature 0', "greedy, from version 3"),
    ],
    "queue": [("shipyard queue", "what waits, and why"), ("shipyard queue --json", "the same, for scripts")],
    "usage": [
        ("shipyard usage", "device-hours and cost per project, the last 7 days"),
        ("shipyard usage --by user --since 30d", "per user, the last 30 days"),
        ("shipyard usage --by type --since 2026-12-01 --csv", "per accelerator type and day, for a sheet"),
    ],
    "quickstart": [
        ("shipyard quickstart", "a few minutes of training on this machine, then a sample"),
        ("shipyard quickstart --model llama-25m --steps 1000", "a bigger model, longer"),
    ],
    "server": [
        ("shipyard server --init-admin admin:'a long passphrase'", "serve the API and the dashboard"),
        ("shipyard server --host 0.0.0.0 --port 8080 --workers 4", "for the team"),
        ("shipyard server --trusted-proxy 10.0.0.5", "behind a reverse proxy: believe its X-Forwarded-For"),
    ],
    "login": [("shipyard login http://shipyard:8080 --user alice", "later commands go to that server")],
    "ui": [
        ("shipyard ui", "the dashboard over this machine's jobs, signed in"),
        ("shipyard ui --port 8800 --no-browser", "print the sign-in link instead of opening it"),
    ],
    "datasets": [("shipyard datasets -p vision", "what the vision project's jobs trained on")],
    "users": [("shipyard users add alice", "an account (asks for the password)")],
    "users add": [
        ("shipyard users add alice", "an account (asks for the password)"),
        ("shipyard users add ci-bot --service", "an account for automation, tokens only"),
    ],
    "users list": [("shipyard users list --json", "every account")],
    "tokens": [("shipyard tokens create laptop --days 30", "a token for 30 days")],
    "tokens create": [
        ("shipyard tokens create laptop --days 30", "a token for 30 days"),
        ("shipyard tokens create ci --scope read --user ci-bot", "a read-only token for another account"),
    ],
    "tokens list": [("shipyard tokens list", "your tokens, without their secrets")],
    "tokens revoke": [("shipyard tokens revoke 5f2c9a1b7e04", "that token stops working at once")],
    "projects": [("shipyard projects grant vision alice member", "alice may submit to vision")],
    "projects grant": [("shipyard projects grant vision alice member", "alice may submit to vision")],
    "projects revoke": [("shipyard projects revoke vision alice", "alice loses her role in vision")],
    "audit": [("shipyard audit verify", "check that no record was altered")],
    "audit verify": [("shipyard audit verify --json", "the chain's check, for monitoring")],
    "audit export": [("shipyard audit export --since 2026-11-01 --out audit-november.jsonl", "a month")],
    "node": [
        ("shipyard node start --head", "make this machine a cluster's head"),
        ("shipyard node stop", "leave: this node's Ray processes end, no other Ray"),
    ],
    "node start": [
        ("shipyard node start --head --rack r1", "this machine becomes the head"),
        ("shipyard node start --address head:6380 --rack r2", "join the head from another machine"),
    ],
    "node stop": [("shipyard node stop", "the node this home started leaves the cluster")],
    "jobs": [
        ("shipyard jobs submit job.yaml --wait", "queue a job and follow it"),
        ("shipyard jobs list --state queued", "what waits, and why"),
    ],
    "jobs submit": [
        ("shipyard jobs submit job.yaml --wait", "queue a job and follow it to the end"),
        ("shipyard jobs submit job.yaml --resume", "continue the last job of that name"),
    ],
    "jobs list": [
        ("shipyard jobs list", "newest first, with progress and why queued ones wait"),
        ("shipyard jobs list --state running --json", "running jobs, for scripts"),
    ],
    "jobs show": [("shipyard jobs show tiny-code-model-3f9a2c1e", "attempts, figures, planned vs measured")],
    "jobs logs": [
        ("shipyard jobs logs tiny-code-model-3f9a2c1e -f", "the log as it grows"),
        ("shipyard jobs logs tiny-code-model-3f9a2c1e --attempt 1", "the first attempt's, before a restart"),
    ],
    "jobs cancel": [("shipyard jobs cancel tiny-code-model-3f9a2c1e", "checkpoint, then stop")],
    "models": [
        ("shipyard models list", "every version"),
        ("shipyard models show tiny-code-model:1", "where version 1 comes from"),
    ],
    "models list": [("shipyard models list tiny-code-model", "the versions of one model")],
    "models promote": [("shipyard models promote assistant:3 production", "version 3 serves")],
    "models delete": [("shipyard models delete assistant:1", "forget version 1")],
    "models show": [("shipyard models show assistant:3", "its job, data, base model and checkpoint")],
    "models compare": [("shipyard models compare assistant:2 assistant:3", "what differs")],
    "models register": [
        ("shipyard models register tiny-code-model-3f9a2c1e --name assistant", "publish a job's export"),
    ],
    "plan": [("shipyard plan train --params 7e9 --accelerator h100-sxm --count 8", "memory, time, cost")],
    "plan train": [
        ("shipyard plan train --params 70e9 --accelerator h100-sxm --count 64 --tokens 2e12", "a 70 B run"),
        ("shipyard plan train --params 8e9 --workload lora --accelerator rtx-4090 --count 1", "LoRA"),
    ],
    "plan infer": [("shipyard plan infer --params 65e9 --accelerator m2-ultra --count 1", "serving")],
    "plan compare": [
        ("shipyard plan compare --params 70e9 --workload lora --rank-by cost", "cheapest first"),
        ("shipyard plan compare --params 8e9 --plot compare.png", "as a chart"),
    ],
    "plan catalog": [("shipyard plan catalog --json", "every accelerator type, with sources")],
    "plan calibrate": [
        ("shipyard plan calibrate --dry-run", "how far the planner is from this cluster's runs"),
        ("shipyard plan calibrate", "fit and plan later jobs with it"),
    ],
    "queues": [("shipyard queues", "quota, use and borrowing per queue")],
    "queues config": [("shipyard queues config > queues.yaml", "the configuration, to edit")],
    "queues apply": [("shipyard queues apply queues.yaml", "put the edited file in force")],
    "queues set": [
        ("shipyard queues set research --nominal h100-sxm=16 --cohort lab", "16 GPUs, lent within lab"),
    ],
    "queues remove": [("shipyard queues remove research", "its jobs wait for another queue")],
    "sim": [("shipyard sim policies", "the policies to simulate")],
    "sim run": [
        (
            "shipyard sim run --throughputs throughputs.json --cluster v100=36,p100=36,k80=36 "
            "--multi-gpu --rate 2.4 --window 4000:5000",
            "Gavel's workload on Shipyard's default policy",
        ),
        (
            "shipyard sim run --throughputs throughputs.json --cluster v100=36 --trace run.json",
            "replay a trace",
        ),
        (
            "shipyard sim run --throughputs throughputs.json --cluster v100=36 --multi-gpu --rate 2.4 "
            "--nodes-per-rack 3 --placement pack",
            "racks of three nodes, gangs placed with no regard to them",
        ),
    ],
    "sim policies": [("shipyard sim policies --json", "the policies, the default first")],
    "spec": [
        ("shipyard spec", "every field: type, default, valid values, why"),
        ("shipyard spec --section training.optimizer", "one section"),
    ],
    "spec example": [
        ("shipyard spec example pretrain -o job.yaml", "a starter that runs as it is"),
        ("shipyard spec example finetune --model ./qwen --data chats.jsonl", "LoRA of a model you have"),
    ],
    "storage": [("shipyard storage put ./corpus corpus", "a dataset, replicated and verified")],
    "storage put": [
        ("shipyard storage put ./corpus corpus", "jobs then read it as store:corpus"),
        ("shipyard storage put ./weights base --encrypt --replicas 3", "encrypted, three copies"),
    ],
    "storage get": [
        ("shipyard storage get ckpt/run-1/step-1000 ./restored --project nlp", "every byte verified"),
    ],
    "storage ls": [("shipyard storage ls -p vision", "the vision project's artifacts")],
    "storage stat": [("shipyard storage stat corpus", "its files and digests")],
    "storage rm": [("shipyard storage rm corpus", "freed by the next gc")],
    "storage scrub": [("shipyard storage scrub --repair", "verify every copy, mend what is bad")],
    "storage gc": [("shipyard storage gc", "free unreferenced blobs")],
    "storage recover": [("shipyard storage recover", "rebuild the catalog from the manifests")],
    "storage status": [("shipyard storage status", "roots, free space, artifacts")],
    "storage rotate-key": [("shipyard storage rotate-key", "a new master key; no data rewritten")],
    "storage bench": [("shipyard storage bench --size-mib 1024", "the store beside a plain file")],
    "storage roots": [("shipyard storage roots ls", "where copies live")],
    "storage roots ls": [("shipyard storage roots ls --json", "roots, domains, free space")],
    "storage roots add": [("shipyard storage roots add /mnt/disk2 --rack r2", "a root on another rack")],
    "storage roots remove": [("shipyard storage roots remove /mnt/disk1", "move its copies off first")],
}


def examples(*lines: tuple[str, str]) -> str:
    """A help page's closing block: ``(command line, what it does)`` pairs, the words as a comment
    above the command, so a narrow terminal wraps neither."""
    shown = "\n\n".join(f"  # {what}\n  {command}" for command, what in lines)
    return f"Examples:\n\n{shown}\n"


def add_examples(command: Any, path: str = "") -> None:  # typer's click.Command
    """Every command of the tree ends its help with its examples."""
    if path in EXAMPLES:
        command.epilog = examples(*EXAMPLES[path])
    for name, sub in getattr(command, "commands", {}).items():
        add_examples(sub, f"{path} {name}".strip())
