"""A pynsq (PyPI) publisher/consumer run by the interop tests as a separate process.

  pub  --nsqd H:P --topic T --count N [--mpub B] [--defer MS]     prints "published N"
  sub  (--nsqd H:P | --lookupd http://H:P ...) --topic T --channel C [--max-in-flight K] [--req-first] [--touch]
       [--msg-timeout MS]   prints one JSON line per finished message; stops on SIGTERM
       or after --count finished messages.
  both: [--tls --ca FILE [--cert PEM]] [--snappy | --deflate [--deflate-level N]] [--auth-secret S]
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import sys
from typing import Any

import nsq
import tornado.ioloop


def features(args: argparse.Namespace) -> dict[str, Any]:
    """Connection options for TLS, compression and AUTH (pynsq's Conn keyword arguments)."""
    out: dict[str, Any] = {}
    if args.tls:
        tls_options: dict[str, Any] = {"ca_certs": args.ca, "cert_reqs": ssl.CERT_REQUIRED,
                                       "ssl_version": ssl.PROTOCOL_TLS_CLIENT}
        if args.cert:
            tls_options["certfile"] = args.cert
        out.update(tls_v1=True, tls_options=tls_options)
    if args.snappy:
        out["snappy"] = True
    if args.deflate:
        out.update(deflate=True, deflate_level=args.deflate_level)
    if args.auth_secret:
        out["auth_secret"] = args.auth_secret
    return out


def pub(args: argparse.Namespace) -> None:
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([args.nsqd], **features(args))
    bodies = [f"{args.prefix}{i}".encode() for i in range(args.count)]
    pending = {"n": 0}

    def done(conn: object, data: object) -> None:
        if isinstance(data, Exception):
            print(f"publish failed: {data!r}", file=sys.stderr)
            loop.stop()
            sys.exit(1)
        pending["n"] -= 1
        if pending["n"] == 0:
            print(f"published {args.count}", flush=True)
            loop.stop()

    def start() -> None:
        if not writer.conns:
            loop.call_later(0.05, start)
            return
        if args.mpub:
            chunks = [bodies[i:i + args.mpub] for i in range(0, len(bodies), args.mpub)]
            pending["n"] = len(chunks)
            for chunk in chunks:
                writer.mpub(args.topic, chunk, callback=done)
        elif args.defer:
            pending["n"] = len(bodies)
            for body in bodies:
                writer.dpub(args.topic, args.defer, body, callback=done)
        else:
            pending["n"] = len(bodies)
            for body in bodies:
                writer.pub(args.topic, body, callback=done)

    loop.call_later(0.05, start)
    nsq.run()


def sub(args: argparse.Namespace) -> None:
    loop = tornado.ioloop.IOLoop.current()
    finished = {"n": 0}

    def handler(message: nsq.Message) -> bool | None:
        if args.req_first and message.attempts == 1:
            message.requeue(backoff=False, delay=0)
            return None
        if args.touch:
            message.enable_async()
            touches = {"n": 0}

            def touch() -> None:
                if touches["n"] < 4:
                    touches["n"] += 1
                    message.touch()
                    loop.call_later(args.msg_timeout / 2500, touch)
                else:
                    report(message)
                    message.finish()
            loop.call_later(args.msg_timeout / 2500, touch)
            return None
        report(message)
        return True

    def report(message: nsq.Message) -> None:
        print(json.dumps({"id": message.id.decode(), "body": message.body.decode(),
                          "attempts": message.attempts}), flush=True)
        finished["n"] += 1
        if args.count and finished["n"] >= args.count:
            loop.call_later(0.2, loop.stop)  # let the last FIN go out

    kwargs = features(args)
    if args.msg_timeout:
        kwargs["msg_timeout"] = args.msg_timeout / 1000  # pynsq takes seconds
    if args.lookupd:
        kwargs["lookupd_http_addresses"] = args.lookupd
        kwargs["lookupd_poll_interval"] = 1
        kwargs["lookupd_poll_jitter"] = 0.0
    else:
        kwargs["nsqd_tcp_addresses"] = [args.nsqd]
    nsq.Reader(topic=args.topic, channel=args.channel, message_handler=handler,
               max_in_flight=args.max_in_flight, max_tries=0, **kwargs)
    signal.signal(signal.SIGTERM, lambda *_: loop.add_callback_from_signal(loop.stop))
    nsq.run()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["pub", "sub"])
    parser.add_argument("--nsqd", default="")
    parser.add_argument("--lookupd", action="append", default=[], help="lookupd HTTP address (sub)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--channel", default="ch")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--prefix", default="msg-")
    parser.add_argument("--mpub", type=int, default=0)
    parser.add_argument("--defer", type=int, default=0)
    parser.add_argument("--max-in-flight", type=int, default=1)
    parser.add_argument("--req-first", action="store_true")
    parser.add_argument("--touch", action="store_true")
    parser.add_argument("--msg-timeout", type=int, default=0)
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--ca", default="")
    parser.add_argument("--cert", default="")
    parser.add_argument("--snappy", action="store_true")
    parser.add_argument("--deflate", action="store_true")
    parser.add_argument("--deflate-level", type=int, default=6)
    parser.add_argument("--auth-secret", default="")
    args = parser.parse_args()
    (pub if args.mode == "pub" else sub)(args)


if __name__ == "__main__":
    main()
