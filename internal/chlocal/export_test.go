package chlocal

// SetSystemDirs replaces the folders searched after PATH (tests only).
func SetSystemDirs(dirs []string) (restore func()) {
	old := systemDirs
	systemDirs = dirs
	return func() { systemDirs = old }
}
