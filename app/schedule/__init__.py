"""Work that starts on a clock rather than a webhook: scheduled digests."""
