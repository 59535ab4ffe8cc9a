"""Two models in one program: a small model drafts, a large model checks the draft with a
Select, and the large model rewrites the answer only when it judges the draft bad.

    radixmesh serve --model /models/small ... (a mesh serving both models)
    python examples/programs/draft_and_check.py "Why is the sky blue?" \\
        --small qwen2.5-0.5b --large llama-3.1-8b

With one model (the default tiny mesh) pass the same name twice, or none: every
statement then runs on the mesh's default model.
"""

from __future__ import annotations

import argparse
import json

from radixmesh.lang import Client, assistant, gen, program, select, system, user


def build(small: str, large: str):
    @program(name="draft_and_check")
    def draft_and_check(s, question):
        s += system("Answer in one sentence.")
        s += user(question)
        s += assistant(gen("draft", max_tokens=48, model=small))
        s += user("Is that answer correct and complete? Reply yes or no.")
        s += assistant(select("verdict", ["yes", "no"], model=large))
        if s["verdict"] == "no":
            s += user("Write a better answer.")
            s += assistant(gen("final", max_tokens=64, model=large))
            return s["final"]
        return s["draft"]

    return draft_and_check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question")
    parser.add_argument("--small", default="", help="the drafting model")
    parser.add_argument("--large", default="", help="the checking model")
    parser.add_argument("--target", default=None)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    result = build(args.small, args.large).run(
        client=Client(args.target, api_key=args.api_key), question=args.question
    )
    scores = [e.select for e in result.events if e.WhichOneof("event") == "select"]
    print(json.dumps({
        "answer": result.value,
        "verdict": result["verdict"],
        "scores": {c.choice: c.score for c in scores[0].scores} if scores else {},
        "usage": result.usage,
    }, ensure_ascii=False, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
