#!/usr/bin/env python3
"""Renders chat templates with Python Jinja2 the way Hugging Face transformers'
apply_chat_template does (sandboxed environment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson, raise_exception and strftime_now): the reference for
templates transformers.js cannot run (Qwen3's).

  python3 render_jinja2.py REQUESTS.json

REQUESTS.json is a list of {"template", "bos_token", "eos_token", "messages",
"add_generation_prompt", "kwargs"}; prints a JSON list with, per request,
{"rendered": text} or {"error": message}. Exits 77 when jinja2 is missing.
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is not installed", file=sys.stderr)
    sys.exit(77)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    with open(sys.argv[1], encoding="utf-8") as f:
        requests = json.load(f)
    out = []
    for r in requests:
        try:
            template = env.from_string(r["template"])
            text = template.render(messages=r["messages"], tools=None, documents=None,
                                   add_generation_prompt=r["add_generation_prompt"],
                                   bos_token=r["bos_token"], eos_token=r["eos_token"],
                                   **r.get("kwargs", {}))
            out.append({"rendered": text})
        except jinja2.exceptions.TemplateError as e:
            out.append({"error": str(e)})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
