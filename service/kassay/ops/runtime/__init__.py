"""The ops' runtime: seeded input generators and float64 references (torch).

`kassay.ops` holds each op's torch-free contract; the worker side reaches this package through
`Op.make_inputs` / `Op.reference`, so the API never imports it.
"""
