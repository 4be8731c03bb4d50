// Validates custom resources against the schemas of their operator's CRDs, as published in the
// @kubernetes-models packages (generated from the CRDs; bundled, no network). Reads a JSON array
// of Kubernetes objects on stdin; prints one line per object; exit status 1 if any is invalid or
// of a kind it has no schema for.
const SCHEMAS = {
  'monitoring.coreos.com/v1/PodMonitor': async () =>
    (await import('@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor')).PodMonitor
}

let input = ''
for await (const chunk of process.stdin) input += chunk
let failed = false
for (const object of JSON.parse(input)) {
  const key = `${object.apiVersion}/${object.kind}`
  const name = `${key} ${object.metadata && object.metadata.name}`
  if (!SCHEMAS[key]) {
    console.log(`${name}: no schema`)
    failed = true
    continue
  }
  try {
    const Model = await SCHEMAS[key]()
    new Model(object).validate()
    console.log(`${name}: valid`)
  } catch (err) {
    console.log(`${name}: INVALID ${err.message}`)
    failed = true
  }
}
process.exit(failed ? 1 : 0)
