"""The ground floor: what crosses process boundaries, shared by every process and importing no
torch.

  v1/          the generated protobuf/gRPC stubs of the worker contract (protos/kassay/contract/
               v1/worker.proto; `make protos` regenerates them, `protogen.py`)
  spec.py      the job spec language: JobSpec (what a user posts), Suite, GroupSpec (what a worker
               runs), the policies and parse_spec (expanding grids into groups needs the op
               contracts: kassay.ops.expand, a floor up)
  documents.py reading a JSON or YAML document strictly (the spec's and a suite file's)
  results.py   what a case and a job come to: Status, CaseResult, Summary, Report (the
               `kassay.report/v1` JSON schema), and the statuses' one list
  report_schema.py  the report's JSON Schema (docs/report.schema.json: `python -m
               kassay.contract.report_schema [--check]`)
  comparison.py  a job against another: Comparison, its entries and verdicts
  names.py     a case's short name within its report
  wire.py      the one pydantic <-> protobuf codec of that contract (GroupSpec, CaseResult, ...)
  keepalive.py the HTTP/2 keepalive policy both ends of an API -> worker channel set
  addresses.py worker addresses: a KASSAY_WORKERS entry, and whether one stays on this host

The API and the worker meet only here: the API imports no worker module (the import-graph
test). The pydantic models `wire` encodes (kassay.contract.spec, kassay.contract.results) are
still a floor above; moving them down is #43's next step.
"""
