"""Informers are supervised: one that dies (here: a parse bug raising a TypeError on a Node event, an error
the informer's retry loop does not expect) makes the controller not ready and stop with its own exit code,
instead of running on with a cache that no longer follows the cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kubernetes.aio import client

from machine_preservation.controller.standalone import EXIT_INFORMER_FAILED
from machine_preservation.core.models import Node
from machine_preservation.localcluster.controlplane import ControlPlane
from tests.controller.running import running_controller
from tests.controller.support import aio_client
from tests.polling import eventually_async


async def test_a_dead_informer_makes_the_controller_unready_and_exit(
    control_plane: ControlPlane, namespace: str
) -> None:
    node_name = f"{namespace}-supervised"
    async with running_controller(kubeconfig=control_plane.kubeconfig, namespace=namespace) as running:
        controller = running.controller
        assert controller.caches is not None
        await eventually_async(controller.ready)

        nodes = controller.caches.nodes
        parse = nodes.parse

        def buggy_parse(raw: Mapping[str, Any]) -> Node:
            if raw["metadata"]["name"] == node_name:
                raise TypeError("a bug in the model")
            return parse(raw)

        nodes.parse = buggy_parse
        api = await aio_client(control_plane.kubeconfig)
        try:
            await client.CoreV1Api(api).create_node({"metadata": {"name": node_name}})
            exit_code = await asyncio.wait_for(running.task, 30)
        finally:
            await client.CoreV1Api(api).delete_node(node_name)
            await api.close()
        assert exit_code == EXIT_INFORMER_FAILED
        assert controller.informer_failed.is_set()
        assert not controller.ready()
