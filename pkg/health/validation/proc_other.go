//go:build !unix

package validation

import "os/exec"

// killGroup: without process groups only the command itself is killed (exec's default).
func killGroup(*exec.Cmd) {}
