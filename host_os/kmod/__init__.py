"""The guest kernel helper (issue 14): a kernel module built against the guest kernel's own
headers in a Debian trixie build root (:mod:`.build`), loaded into a running guest
(:mod:`.load`)."""
