"""Admin actions as nsqadmin performs them: on every lookupd and every producing nsqd.

Theory of operation
-------------------
Each action first learns who holds the topic (``Cluster.topic_producers``; before any
deletion, since deleting at the lookupds forgets the producers), then sends the NSQ v1.3
routes to all of them at once and returns the per-node error texts. ``AllFailed`` is raised
when every request failed (the API answers 502 ``UPSTREAM_ERROR``); fewer failures come
back as warnings (200 with ``"message":"WARNING: …"``). What each action touches:

- create: ``/topic/create`` (and ``/channel/create``) on every lookupd; with
  ``--nsqd-http-address`` on every nsqd; a new channel is also created on the topic's
  current producers so consumers see it at once;
- delete: ``/topic/delete`` or ``/channel/delete`` on every lookupd and every producer
  (a 404 there — already gone — is not an error);
- pause / unpause / empty: ``/topic/<action>`` or ``/channel/<action>`` on every producer;
- tombstone: ``/topic/tombstone?topic=&node=`` on every lookupd, then ``/topic/delete`` on
  that node, as nsqadmin does.
"""

from __future__ import annotations

from pynsqd.admin.cluster import AllFailed, Cluster

Call = tuple[str, str, dict[str, str] | None]


async def _send(cluster: Cluster, calls: list[Call], ok_404: bool = False) -> list[str]:
    """POST every call; raises ``AllFailed`` if every one failed; returns the failures."""
    if not calls:
        return []
    _, failed = await cluster.fan_out("POST", calls, ok_statuses=(404,) if ok_404 else ())
    if len(failed) >= len(calls):
        raise AllFailed("\n".join(failed))
    return failed


async def create(cluster: Cluster, topic: str, channel: str) -> list[str]:
    targets = cluster.lookupds or cluster.nsqds
    calls: list[Call] = [(a, "/topic/create", {"topic": topic}) for a in targets]
    if channel:
        calls += [(a, "/channel/create", {"topic": topic, "channel": channel}) for a in targets]
    errors = await _send(cluster, calls)
    if channel and cluster.lookupds:
        producers, more = await cluster.topic_producers(topic)
        errors += more
        errors += await _send(cluster, [(p.http_address, "/channel/create", {"topic": topic, "channel": channel})
                                        for p in producers])
    return errors


async def delete(cluster: Cluster, topic: str, channel: str) -> list[str]:
    producers, errors = await cluster.topic_producers(topic)
    if channel:
        path, params = "/channel/delete", {"topic": topic, "channel": channel}
    else:
        path, params = "/topic/delete", {"topic": topic}
    calls: list[Call] = [(a, path, params) for a in cluster.lookupds]
    calls += [(p.http_address, path, params) for p in producers]
    return errors + await _send(cluster, calls, ok_404=True)


async def topic_channel_action(cluster: Cluster, action: str, topic: str, channel: str) -> list[str]:
    """``action`` is ``pause``, ``unpause`` or ``empty``."""
    producers, errors = await cluster.topic_producers(topic)
    if channel:
        path, params = f"/channel/{action}", {"topic": topic, "channel": channel}
    else:
        path, params = f"/topic/{action}", {"topic": topic}
    return errors + await _send(cluster, [(p.http_address, path, params) for p in producers])


async def tombstone(cluster: Cluster, topic: str, node: str) -> list[str]:
    producers, errors = await cluster.topic_producers(topic)
    calls: list[Call] = [(a, "/topic/tombstone", {"topic": topic, "node": node}) for a in cluster.lookupds]
    errors += await _send(cluster, calls)
    doomed: list[Call] = [(p.http_address, "/topic/delete", {"topic": topic})
                          for p in producers if node in (p.http_address, p.tcp_address)]
    return errors + await _send(cluster, doomed, ok_404=True)
