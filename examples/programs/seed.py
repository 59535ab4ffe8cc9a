"""The seed's structured program, written with radixmesh.lang and run on `radixmesh serve`.

    @struct_output(schema=ANSWER)
    def handle_user_query(query, history):
        if "检索" in query:                  # "retrieve"
            docs = rag_retrieve(query)
            return agent_invoke(docs, query)
        else:
            return chat_response(query, history)

The retrieval branch calls the server's `retrieve` tool (its result is cached: a
repeated query is answered from the tool result cache), then the agent answers under a
JSON schema; the chat branch answers from the history. Both results satisfy ANSWER.
The program's context stays held on the server between statements, so the agent's
answer extends the cached context instead of prefilling it again.

    radixmesh serve &
    python examples/programs/seed.py "请检索退款政策" --target 127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from radixmesh.lang import Client, assistant, gen, program, system, tool, user

ANSWER = json.loads((Path(__file__).with_name("answer_schema.json")).read_text())


@program(output_schema=ANSWER)
def handle_user_query(s, query, history):
    s += system("You are a support agent. Answer in one short sentence.")
    if "检索" in query:
        s += user(query)
        s += assistant(gen("search", max_tokens=8))
        s += tool("retrieve", query=query, k="2", out="docs", timeout_s=5)
        s += user("Documents: {docs}\nAnswer the question from the documents.")
        s += assistant(gen("answer", max_tokens=48, json_schema=ANSWER))
        return s["answer"]
    s += user("History: {history}\nQuestion: {query}")
    s += assistant(gen("answer", max_tokens=48, json_schema=ANSWER))
    return s["answer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("query")
    parser.add_argument("--history", default="")
    parser.add_argument("--target", default=None, help="Envoy's public HOST:PORT")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--interactive", action="store_true", help="run statement by statement")
    args = parser.parse_args()
    client = Client(args.target, api_key=args.api_key)
    mode = "interactive" if args.interactive else "compiled"
    result = handle_user_query.run(client=client, mode=mode, query=args.query, history=args.history)
    branches = [e.branch.then for e in result.events if e.WhichOneof("event") == "branch"]
    cached = [e.tool_finished.cached for e in result.events if e.WhichOneof("event") == "tool_finished"]
    print(json.dumps({
        "result": result.value,
        "retrieval_branch": branches[0] if branches else None,
        "tool_cache_hit": cached[0] if cached else None,
        "usage": result.usage,
    }, ensure_ascii=False, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
