"""The SDK written once, async (kassay_client._sync is generated from it)."""
