package pci

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// MaxAttribute is the most bytes an attribute may hold: sysfs writes "0x10de\n" (7 bytes) and
// "0x030200\n" (9).
const MaxAttribute = 32

// ErrNotRegular says an attribute is not a regular file: a FIFO, a device, a socket, a
// directory or a symbolic link, which real sysfs never has in their place.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge says an attribute holds more than MaxAttribute bytes.
var ErrTooLarge = fmt.Errorf("larger than %d bytes", MaxAttribute)

// readAttribute reads a sysfs attribute: a regular file of at most MaxAttribute bytes. Anything
// else is refused without blocking and without reading more than the limit. Opening a FIFO for
// reading waits for a writer, and reading a device can block, never end or have side effects:
// the file is looked at before it is opened (a device is never opened), opened without following
// a link and without blocking, and looked at again through the descriptor (it may have been
// swapped in between).
func readAttribute(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(fi)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(fi)
	}
	// sysfs says every attribute is 4096 bytes long: the size is found by reading, one byte past
	// the limit.
	b, err := io.ReadAll(io.LimitReader(f, MaxAttribute+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxAttribute {
		return nil, ErrTooLarge
	}
	return b, nil
}

// notRegular says what fi is instead of a regular file.
func notRegular(fi fs.FileInfo) error {
	kind := "a special file"
	switch t := fi.Mode().Type(); {
	case t&fs.ModeNamedPipe != 0:
		kind = "a FIFO"
	case t&fs.ModeDevice != 0:
		kind = "a device"
	case t&fs.ModeSocket != 0:
		kind = "a socket"
	case t&fs.ModeDir != 0:
		kind = "a directory"
	case t&fs.ModeSymlink != 0:
		kind = "a symbolic link"
	}
	return fmt.Errorf("%s, %w", kind, ErrNotRegular)
}
