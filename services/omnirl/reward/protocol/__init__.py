"""The scorer protocol: `scorer.proto` (gRPC), its HTTP/JSON twin, and the numpy codec (`codec`)."""
