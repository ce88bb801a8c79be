"""One-off studies: each file measures one question once and names the doc that quotes it."""
