//go:build !linux

package interop

import (
	"os/exec"
	"syscall"
)

func setProcAttrs(cmd *exec.Cmd) {}

func killGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.Process != nil {
		cmd.Process.Kill()
	}
}
