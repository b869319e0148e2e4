package interop

import (
	"os/exec"
	"syscall"
)

// setProcAttrs puts the server in its own process group (so it and its
// children can be signalled together) and kills it if the test binary dies.
func setProcAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup signals the process group led by cmd's process.
func killGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.Process == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, sig)
}
