"""Where a clip's float32 numbers depend on its batch: the clip alone against the clip in batches of other rows
and other padded lengths, compared bit for bit at every module of the encoder (forward hooks), and its tokens.

A server's batches form by arrival, the CLI's from the sorted folder: a clip whose numbers move with its batch's
rows or padded length can flip a near-tied token between the two.

    python scripts/experiments/f32_invariance.py -m v3.nemo --folder /tmp/f512 --clip clip_366.flac
"""

from __future__ import annotations

import argparse
from collections import OrderedDict

import torch

from graphscribe import load_model
from graphscribe.io.audio import find_audio_files, read_input


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--clip", required=True, help="a file name in the folder")
    parser.add_argument("--graphs", action="store_true", help="with the layer graphs (default: eager)")
    parser.add_argument(
        "--inject",
        action="store_true",
        help="also each stage alone: the clip's own features (computed alone) in every batch's encoder, and its own "
        "encoder output in every batch's decode",
    )
    args = parser.parse_args()
    model = load_model(args.model, dtype="float32", graphs=args.graphs)
    rate = model.sample_rate
    paths = find_audio_files(args.folder)
    target_path = next(p for p in paths if p.name == args.clip)
    target = read_input(str(target_path), rate)
    others = [read_input(str(p), rate) for p in paths[:200] if p != target_path]
    shorter = [a for a in others if a.numel() < target.numel()]
    longer = sorted((a for a in others if a.numel() > target.numel()), key=lambda a: a.numel())
    n = target.numel()
    configs = {
        "alone": ([target], n),
        "alone +0.32 s": ([target], n + int(0.32 * rate)),
        "alone +1.28 s": ([target], n + int(1.28 * rate)),
        "alone +5 s": ([target], n + 5 * rate),
        "B=2 twice": ([target, target], n),
        "B=8 shorter": ([target, *shorter[:7]], n),
        "B=32 shorter": ([target, *shorter[:31]], n),
        "B=8 +longer": ([target, *shorter[:6], longer[0]], longer[0].numel()),
        "B=32 +longer": ([target, *shorter[:30], longer[-1]], longer[-1].numel()),
        "B=64 shorter": ([target, *(shorter * 3)[:63]], n),
    }
    encoder = model.module.encoder
    names = ["pre_encode"]
    watched = {"pre_encode": encoder.pre_encode}
    for i, layer in enumerate(encoder.layers):
        if i < 2:  # the first layers module by module
            for name, module in layer.named_children():
                watched[f"layers.{i}.{name}"] = module
                names.append(f"layers.{i}.{name}")
        watched[f"layers.{i}"] = layer
        names.append(f"layers.{i}")
    seen: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            if name not in seen:  # the first call: row 0
                seen[name] = out[0].detach().float().cpu().clone()

        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in watched.items()]
    results = OrderedDict()
    for label, (audios, width) in configs.items():
        batch = torch.zeros(len(audios), width)
        for i, a in enumerate(audios):
            batch[i, : a.numel()] = a
        lengths = torch.tensor([a.numel() for a in audios])
        seen.clear()
        features, frames = model.batch_features(batch, lengths)
        encoded, enc_lengths = model.encoder_output(features, frames, None, [a.numel() for a in audios])
        hyps = model.decode(encoded, enc_lengths)
        f = int(frames[0])
        results[label] = {
            "features": features[0, :, :f].float().cpu().clone(),
            "encoded": encoded[0, : int(enc_lengths[0])].float().cpu().clone(),
            "ids": hyps[0].token_ids,
            "modules": dict(seen),
            "t": int(enc_lengths[0]),
        }
    if args.inject:
        inject(model, configs, watched, names, seen)
    for h in handles:
        h.remove()
    base = results["alone"]
    t = base["t"]
    for label, r in results.items():
        line = [f"{label:>16}: features {'=' if torch.equal(r['features'], base['features']) else 'DIFF'}"]
        first = None
        for name in names:
            a, b = base["modules"].get(name), r["modules"].get(name)
            if a is None or b is None:
                continue
            a, b = a[..., :t, :] if a.dim() == 2 else a, b[..., :t, :] if b.dim() == 2 else b
            if a.shape != b.shape or not torch.equal(a, b):
                first = name
                diff = (a - b).abs().max().item() if a.shape == b.shape else float("nan")
                break
        line.append("all modules =" if first is None else f"first diff at {first} (max {diff:.3g})")
        enc_diff = (r["encoded"] - base["encoded"]).abs().max().item()
        line.append(f"encoder max diff {enc_diff:.3g}; ids {'=' if r['ids'] == base['ids'] else 'DIFFER'}")
        print("; ".join(line), flush=True)


def inject(model, configs, watched, names, seen) -> None:
    """The encoder given the clip's features computed alone, in every batch (the other rows their own, alone), and
    the decode given the clip's encoder output computed alone: where each stage's numbers move by themselves."""

    def alone(audio):
        features, frames = model.batch_features(audio[None], torch.tensor([audio.numel()]))
        return features[0, :, : int(frames[0])], int(frames[0])

    def encoded_alone(audio):
        features, frames = model.batch_features(audio[None], torch.tensor([audio.numel()]))
        encoded, lengths = model.encoder_output(features, frames, None, [audio.numel()])
        return encoded[0, : int(lengths[0])], int(lengths[0])

    own = {}
    print("-- the encoder on features computed alone; the decode on encoder output computed alone", flush=True)
    for label, (audios, width) in configs.items():
        feats = [alone(a) for a in audios]
        t_pad = max(width // model.cfg.features.hop_length + 1, max(f for _, f in feats))
        batch = torch.zeros(len(audios), model.cfg.features.n_mels, t_pad, device=model.device)
        for i, (f, n) in enumerate(feats):
            batch[i, :, :n] = f
        frames = torch.tensor([n for _, n in feats], device=model.device)
        seen.clear()
        encoded, lengths = model.encoder_output(batch, frames, None, [a.numel() for a in audios])
        t = int(lengths[0])
        modules = {name: seen[name][:t] for name in names if name in seen}
        outs = [encoded_alone(a) for a in audios]
        t_enc = max(n for _, n in outs)
        enc = torch.zeros(len(audios), t_enc, encoded.shape[2], device=model.device, dtype=encoded.dtype)
        for i, (e, n) in enumerate(outs):
            enc[i, :n] = e
        hyps = model.decode(enc, torch.tensor([n for _, n in outs], device=model.device))
        own[label] = (modules, encoded[0, :t].float().cpu(), hyps[0].token_ids)
    base_modules, base_encoded, base_ids = own["alone"]
    for label, (modules, encoded, ids) in own.items():
        first = next((n for n in names if n in modules and not torch.equal(modules[n], base_modules[n])), None)
        where = "all modules =" if first is None else f"first diff at {first}"
        diff = (encoded - base_encoded).abs().max().item()
        print(f"{label:>16}: encoder {where} (max {diff:.3g}); decode ids {'=' if ids == base_ids else 'DIFFER'}")


if __name__ == "__main__":
    main()
