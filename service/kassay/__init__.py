"""kassay — kernel assay: validates GPU kernels against float64 references.

Kept import-light on purpose: `kassay.kernels` must import on a GPU host that has only torch and
triton, so nothing here may pull in pydantic, grpc or the service.
"""

__version__ = "0.1.0"
