// Command packtiny writes the built-in model's weights, builtin/model/model.gguf,
// from a training run's bf16 checkpoint (tools/train): the matrices in Q8_0,
// norms and other small tensors in F32, under the checkpoint's tensor names,
// exactly as ferrite's `--quant q8_0` would quantize the checkpoint on load
// (see Pack). ferrite-tiny's config.json and tokenizer files are copied from
// the checkpoint as they are; tools/train/install.sh runs this after a run.
//
//	go run ./tools/packtiny -checkpoint /tmp/ft/model -out builtin/model/model.gguf
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "packtiny:", err)
		os.Exit(1)
	}
}

func run() error {
	ckpt := flag.String("checkpoint", "", "checkpoint directory (config.json and model.safetensors)")
	out := flag.String("out", "builtin/model/model.gguf", "the GGUF file to write")
	quant := flag.String("quant", "q8_0", "quantization of the matrices (q8_0 or q4_k)")
	name := flag.String("name", "ferrite-tiny", "general.name")
	threads := flag.Int("threads", 0, "CPU threads (0: one per CPU)")
	flag.Parse()
	if *ckpt == "" {
		return errors.New("-checkpoint is required")
	}
	data, err := Pack(*ckpt, *quant, *name, *threads)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "packtiny: wrote %s (%d bytes)\n", *out, len(data))
	return nil
}
