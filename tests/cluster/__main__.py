"""Run the real cluster by hand: ``python -m tests.cluster prepare``, ``up`` or ``cleanup``.

``prepare`` builds (or finds in the cache) every image the cluster tests run,
as ``scripts/test`` does before pytest; ``up`` brings the cluster up, prints
the admin kubeconfig's path and waits for Enter (or end of input), then tears
it down and checks the host; ``cleanup`` undoes what a killed run left behind.
"""

from __future__ import annotations

import asyncio
import sys

from tests.cluster import cluster, images, install


async def _up() -> None:
    async with cluster.running_cluster() as running:
        print(f"KUBECONFIG={running.plane.admin_kubeconfig}", flush=True)
        for node in running.nodes:
            print(f"{node.name}: {node.net.address} in netns {node.net.netns}, {node.dir}")
        await asyncio.to_thread(sys.stdin.readline)


def main(argv: list[str]) -> int:
    if argv == ["up"]:
        asyncio.run(_up())
        return 0
    if argv == ["prepare"]:
        for image in (
            images.pause(),
            images.qemu_vm().path,
            images.subres(install.IMAGE.rsplit(":", 1)[1], "a").path,
            images.subres(install.NEXT_TAG, "b").path,
        ):
            print(image, flush=True)
        return 0
    if argv == ["cleanup"]:
        problems = cluster.cleanup_stale()
        print("\n".join(problems) or "nothing left behind")
        return 1 if problems else 0
    print("usage: python -m tests.cluster prepare|up|cleanup", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
