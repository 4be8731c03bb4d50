// An nsqjs (npm) publisher/consumer run by the interop tests as a separate process.
// Same arguments as tests/support/clients/pynsq_app.py:
//   pub --nsqd H:P --topic T --count N [--mpub B] [--defer MS]
//   sub --nsqd H:P --topic T --channel C [--max-in-flight K] [--req-first] [--touch] [--msg-timeout MS] [--count N]
//   both: [--tls --ca FILE [--cert PEM]] [--snappy | --deflate [--deflate-level N]] [--auth-secret S]
'use strict'
const fs = require('fs')
const nsq = require('nsqjs')
const FLAGS = ['req-first', 'touch', 'tls', 'snappy', 'deflate']

function parse (argv) {
  const args = { mode: argv[0], channel: 'ch', count: 0, prefix: 'msg-', mpub: 0, defer: 0, maxInFlight: 1, msgTimeout: 0 }
  for (let i = 1; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '')
    if (FLAGS.includes(key)) args[key.replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = true
    else {
      const value = argv[++i]
      const camel = key.replace(/-([a-z])/g, (_, c) => c.toUpperCase())
      args[camel] = /^\d+$/.test(value) ? Number(value) : value
    }
  }
  return args
}

// Connection options for TLS, compression and AUTH (nsqjs's ConnectionConfig).
function features (args) {
  const out = {}
  if (args.tls) {
    out.tls = true
    out.ca = fs.readFileSync(args.ca)
    if (args.cert) { out.cert = fs.readFileSync(args.cert); out.key = fs.readFileSync(args.cert) }
  }
  if (args.snappy) out.snappy = true
  if (args.deflate) { out.deflate = true; out.deflateLevel = args.deflateLevel || 6 }
  if (args.authSecret) out.authSecret = String(args.authSecret)
  return out
}

function pub (args) {
  const [host, port] = args.nsqd.split(':')
  const writer = new nsq.Writer(host, Number(port), features(args))
  const bodies = []
  for (let i = 0; i < args.count; i++) bodies.push(`${args.prefix}${i}`)
  writer.on('error', (err) => { console.error(`publish failed: ${err}`); process.exit(1) })
  writer.on('ready', () => {
    let pending = 0
    const done = (err) => {
      if (err) { console.error(`publish failed: ${err}`); process.exit(1) }
      if (--pending === 0) { console.log(`published ${args.count}`); writer.close(); process.exit(0) }
    }
    if (args.mpub) {
      for (let i = 0; i < bodies.length; i += args.mpub) { pending++; writer.publish(args.topic, bodies.slice(i, i + args.mpub), done) }
    } else if (args.defer) {
      for (const body of bodies) { pending++; writer.deferPublish(args.topic, [body], args.defer, done) }
    } else {
      for (const body of bodies) { pending++; writer.publish(args.topic, body, done) }
    }
  })
  writer.connect()
}

function sub (args) {
  const options = { nsqdTCPAddresses: [args.nsqd], maxInFlight: args.maxInFlight, maxAttempts: 0, ...features(args) }
  if (args.msgTimeout) options.messageTimeout = args.msgTimeout
  const reader = new nsq.Reader(args.topic, args.channel, options)
  let finished = 0
  const report = (msg) => {
    console.log(JSON.stringify({ id: msg.id, body: msg.body.toString(), attempts: msg.attempts }))
    msg.finish()
    finished++
    if (args.count && finished >= args.count) setTimeout(() => { reader.close(); process.exit(0) }, 200)
  }
  reader.on('message', (msg) => {
    if (args.reqFirst && msg.attempts === 1) { msg.requeue(0, false); return }
    if (args.touch) {
      let touches = 0
      const touch = () => {
        if (touches++ < 4) { msg.touch(); setTimeout(touch, args.msgTimeout / 2.5) } else report(msg)
      }
      setTimeout(touch, args.msgTimeout / 2.5)
      return
    }
    report(msg)
  })
  reader.on('error', (err) => console.error(`reader error: ${err}`))
  process.on('SIGTERM', () => { reader.close(); process.exit(0) })
  reader.connect()
}

const args = parse(process.argv.slice(2))
if (args.mode === 'pub') pub(args); else sub(args)
