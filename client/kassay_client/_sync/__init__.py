# Generated from kassay_client/_async/__init__.py by client/gen_sync.py (unasync): do not
# edit; edit the async definition and run `make sdk`.
"""The SDK written once, async (kassay_client._sync is generated from it)."""
