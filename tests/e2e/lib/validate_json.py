#!/usr/bin/env python3
# Validates one JSON instance against a JSON schema with a real JSON Schema implementation (Python's jsonschema,
# Debian's python3-jsonschema, which scripts/setup installs), for the end-to-end tests of --json-schema
# (tests/e2e/structured_output.sh). Exit 0 when the instance is strict JSON and valid, 1 with the reason on stderr
# otherwise, 2 on a usage error or a missing jsonschema.
#
#   validate_json.py SCHEMA_FILE < INSTANCE              the instance is stdin
#   validate_json.py --jsonl-text SCHEMA_FILE < RECORD   stdin is one --output-format jsonl record: its "text" field
#                                                        is the instance
#
# The schema is checked with the Draft 2020-12 validator (prefixItems, $defs) and with format checking on. Every
# format the schema names must have a check here, or the run fails (so a format is never silently unchecked):
#   - uuid: jsonschema's own check (uuid.UUID, dashes at 8, 13, 18, 23), which needs no optional package;
#   - date, time, date-time: explicit RFC 3339 regexes below plus datetime's calendar check, not jsonschema's:
#     jsonschema checks time and date-time only when the optional package rfc3339-validator is installed (Debian
#     12 does not package it, so Debian's jsonschema 4.10 skips them silently), and its date check is
#     date.fromisoformat, which on Python 3.11 also takes forms that are not RFC 3339 full-date ("20240105");
#   - email: an explicit regex (RFC 5322 dot-atom local part, a domain of two or more LDH labels), not jsonschema's
#     check, which only asks for an "@" somewhere.
# Strict JSON: NaN/Infinity and duplicate member names are rejected (Python's json module accepts both).
import datetime
import json
import re
import sys

try:
    import jsonschema
    from jsonschema import Draft202012Validator, FormatChecker
except ImportError:
    print("validate_json: Python's jsonschema is missing (Debian: apt-get install python3-jsonschema; "
          "scripts/setup installs it)", file=sys.stderr)
    sys.exit(2)

_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = re.compile(r"([01]\d|2[0-3]):([0-5]\d):([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)", re.ASCII)
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_EMAIL = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})+", re.ASCII)


def is_date(s):
    m = _DATE.fullmatch(s)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))  # the calendar: no February 30
    except ValueError:
        return False
    return True


def is_time(s):
    return _TIME.fullmatch(s) is not None


def is_date_time(s):
    date, sep, time = s[:10], s[10:11], s[11:]
    return sep in ("T", "t") and is_date(date) and is_time(time)


def is_email(s):
    return _EMAIL.fullmatch(s) is not None and len(s) <= 254


def format_checker():
    checker = FormatChecker(formats=("uuid",))
    for name, check in (("date", is_date), ("time", is_time), ("date-time", is_date_time), ("email", is_email)):
        checker.checks(name)(lambda instance, check=check: not isinstance(instance, str) or check(instance))
    return checker


def formats_in(schema, out):
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "format" and isinstance(value, str):
                out.add(value)
            else:
                formats_in(value, out)
    elif isinstance(schema, list):
        for value in schema:
            formats_in(value, out)
    return out


def no_duplicates(pairs):
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"duplicate member name {key!r}")
        seen.add(key)
    return dict(pairs)


def reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_strict(text):
    return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=reject_constant)


def main(argv):
    jsonl = argv[:1] == ["--jsonl-text"]
    if jsonl:
        argv = argv[1:]
    if len(argv) != 1:
        print("usage: validate_json.py [--jsonl-text] SCHEMA_FILE < INSTANCE", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        schema = json.load(f)
    Draft202012Validator.check_schema(schema)
    checker = format_checker()
    unchecked = formats_in(schema, set()) - set(checker.checkers)
    if unchecked:
        print(f"validate_json: no check for format {', '.join(sorted(unchecked))}", file=sys.stderr)
        return 2
    text = sys.stdin.read()
    try:
        if jsonl:
            lines = text.splitlines()
            if len(lines) != 1:
                raise ValueError(f"{len(lines)} lines, not one jsonl record")
            record = parse_strict(lines[0])
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError("the record has no string field \"text\"")
            text = record["text"]
        instance = parse_strict(text)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        print(f"not JSON: {e}", file=sys.stderr)
        return 1
    errors = sorted(Draft202012Validator(schema, format_checker=checker).iter_errors(instance),
                    key=lambda e: list(e.absolute_path))
    for e in errors:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        print(f"invalid at {where}: {e.message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
