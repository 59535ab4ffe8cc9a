// A second-language client of radixmesh.v1.Inference: @grpc/grpc-js + @grpc/proto-loader
// on the project's own .proto files. Usage:
//   node node_client.js TARGET API_KEY REQUEST_JSON INCLUDE_DIR...
// Streams one Generate call and prints {"text", "finish_reason", "usage", "code", "details"}.
"use strict";
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [target, apiKey, requestJson, ...includeDirs] = process.argv.slice(2);
const definition = protoLoader.loadSync("radixmesh/v1/inference.proto", {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: false,
  oneofs: true,
  includeDirs,
});
const v1 = grpc.loadPackageDefinition(definition).radixmesh.v1;
const client = new v1.Inference(target, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
metadata.add("authorization", `Bearer ${apiKey}`);

const result = { text: "", finish_reason: null, usage: null, code: 0, details: "" };
const call = client.Generate(JSON.parse(requestJson), metadata);
call.on("data", (response) => {
  if (response.chunk) result.text += response.chunk.text;
  if (response.complete) {
    result.finish_reason = response.complete.finish_reason;
    result.usage = response.complete.usage;
  }
});
call.on("error", (err) => {
  result.code = err.code;
  result.details = err.details;
});
call.on("close", () => {
  console.log(JSON.stringify(result));
  client.close();
});
