package sandbox

// Revocations is the number of RevokeTokens calls so far.
func (s *Server) Revocations() uint64 { return s.revoked.Load() }
