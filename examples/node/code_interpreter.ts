// A code-interpreter loop on sandbox-libkrun, in TypeScript with the official iii-sdk from npm:
// create a sandbox, write a data file into it, run generated code against it, read the result
// file back, stop. The engine's address comes from III_URL (default ws://127.0.0.1:49134).
import { registerWorker } from 'iii-sdk'

/** The replies this example reads (docs/functions.md has them whole). */
interface Created {
  sandbox_id: string
}
interface ExecReply {
  exit_code: number
  stdout: string
  stderr: string
}
interface ReadReply {
  body: string
}

const url = process.env.III_URL ?? 'ws://127.0.0.1:49134'

// What a model would generate: read the data, compute, write a result file, print a summary.
const generated = `
const fs = require('fs')
const [, ...rows] = fs.readFileSync('/work/sales.csv', 'utf8').trim().split('\\n').map(l => l.split(','))
const revenue = Math.round(rows.reduce((sum, [, units, price]) => sum + units * price, 0) * 100) / 100
const best = rows.reduce((a, b) => (+b[1] > +a[1] ? b : a))[0]
fs.writeFileSync('/work/result.json', JSON.stringify({ best_seller: best, revenue, rows: rows.length }))
console.log(\`analysed \${rows.length} rows\`)
`
const data = 'item,units,price\napple,30,0.5\npear,12,0.75\nplum,45,0.2\n'

// OTel off: the SDK would print its telemetry set-up on stdout, among the example's output.
const iii = registerWorker(url, { workerName: 'code-interpreter-example', otel: { enabled: false } })
const call = <T>(fn: string, payload: Record<string, unknown>): Promise<T> =>
  iii.trigger({ function_id: `sandbox-libkrun::${fn}`, payload, timeoutMs: 120000 }) as Promise<T>

const { sandbox_id } = await call<Created>('create', { image: 'node' })
console.log('created a node sandbox')
try {
  await call('fs::write', { sandbox_id, path: '/work/sales.csv', content: data, parents: true })
  await call('fs::write', { sandbox_id, path: '/work/job.js', content: generated })
  const ran = await call<ExecReply>('exec', { sandbox_id, argv: ['node', '/work/job.js'], timeout_ms: 60000 })
  console.log(`exit code ${ran.exit_code}, stdout: ${ran.stdout.trim()}`)
  const result = await call<ReadReply>('fs::read', { sandbox_id, path: '/work/result.json' })
  console.log('result:', result.body)
} finally {
  await call('stop', { sandbox_id })
  console.log('stopped')
  await iii.shutdown()
  process.exit(0)
}
