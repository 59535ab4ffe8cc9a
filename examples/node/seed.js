// The seed's structured program from Node.js: the whole program is one Programs/Run call;
// the server runs its branch, tool call and generations. Usage:
//   npm install
//   node seed.js TARGET QUERY [--history TEXT] [--api-key KEY] [--include DIR]...
// TARGET is Envoy's public HOST:PORT of `radixmesh serve`. The program is
// ../programs/seed_program.json (the same program examples/programs/seed.py compiles to).
// --include names folders holding google/api/annotations.proto and
// google/protobuf/*.proto when they are not beside ../../protos.
// Prints {"result", "retrieval_branch", "tool_cache_hit", "usage", "code", "details"}.
"use strict";
const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

function parseArgs(argv) {
  const args = { positional: [], history: "", apiKey: "", includes: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--history") args.history = argv[++i];
    else if (argv[i] === "--api-key") args.apiKey = argv[++i];
    else if (argv[i] === "--include") args.includes.push(argv[++i]);
    else args.positional.push(argv[i]);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const [target, query] = args.positional;
if (!target || !query) {
  console.error("usage: node seed.js TARGET QUERY [--history TEXT] [--api-key KEY] [--include DIR]...");
  process.exit(2);
}
const definition = protoLoader.loadSync("radixmesh/v1/program.proto", {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: false,
  oneofs: true,
  includeDirs: [path.join(__dirname, "..", "..", "protos"), ...args.includes],
});
const v1 = grpc.loadPackageDefinition(definition).radixmesh.v1;
const client = new v1.Programs(target, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
if (args.apiKey) metadata.add("authorization", `Bearer ${args.apiKey}`);

const program = JSON.parse(
  fs.readFileSync(path.join(__dirname, "..", "programs", "seed_program.json"), "utf8"),
);
const request = { program, inputs: { query, history: args.history } };
const out = { result: null, retrieval_branch: null, tool_cache_hit: null, usage: [], code: 0, details: "" };
const call = client.Run(request, metadata);
call.on("data", (event) => {
  if (event.branch) out.retrieval_branch = Boolean(event.branch.then);
  if (event.tool_finished) out.tool_cache_hit = Boolean(event.tool_finished.cached);
  if (event.result) {
    out.result = JSON.parse(event.result.value_json);
    out.usage = event.result.usage.map((u) => ({
      statement: u.statement,
      prompt_tokens: Number(u.usage.prompt_tokens || 0),
      completion_tokens: Number(u.usage.completion_tokens || 0),
      cached_tokens: Number(u.usage.cached_tokens || 0),
    }));
  }
});
call.on("error", (err) => {
  out.code = err.code;
  out.details = err.details;
});
call.on("close", () => {
  console.log(JSON.stringify(out));
  client.close();
});
