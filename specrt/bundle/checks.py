"""What `load` verifies in a manifest before any backend runs (README "Safety"), beyond checksums.

* Structure and values (on construction of the schema dataclasses, schema.py / entries.py / parts.py):
  types, ranges and consistency (`max_seq_len` against the recorded profiles, the
  decoder config against the ONNX graph's inputs and outputs), each failure a `ManifestError` naming
  the key.
* Files: the file list is non-empty; every path the manifest references (graphs, their external data,
  configs, tokenizer, engines) is listed, so it is checksummed; every listed path resolves (symlinks
  followed) inside the bundle root.
* Graphs: every variant the runtime can open (portable, fused, quantized, Medusa, draft head) goes through
  `check_graphs`: listed external data, declared inputs/outputs, the slot's precision and the quantization the
  manifest records (bits, block size, accuracy level: quant_checks.py), read by graph_scan.py without the onnx
  package.
* Memory: the KV cache that `max_seq_len` and the decoder config imply must fit in available memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from specrt.core.errors import BundleError, ManifestError
from specrt.bundle.graph_scan import GraphFacts, GraphScanError, scan_graph
from specrt.bundle.paths import resolve_inside
from specrt.bundle.quant_checks import check_head_precision, check_quantized_graph

if TYPE_CHECKING:
    from specrt.bundle.schema import Manifest


# ---------------------------------------------------------------------------------------- values
def check_profiles(profiles: dict, key: str, max_seq_len: int, max_draft_tokens: int) -> None:
    """The recorded profiles were derived from max_seq_len / max_draft_tokens at compile time: an edited
    limit would run shapes the graphs were never validated (or TensorRT engines built) for."""
    try:
        past_max = profiles["decode"]["past_key.0"]["max"][1]
        verify_max = profiles["verify"]["input_ids"]["max"][1]
    except (KeyError, IndexError, TypeError):
        raise ManifestError(f"manifest key {key}.profiles lacks decode/verify shapes; recompile the bundle") from None
    if past_max != max_seq_len - 1:
        raise ManifestError(f"manifest key 'max_seq_len' is {max_seq_len} but {key} was compiled and validated for "
                            f"{past_max + 1} (profiles); recompile with --max-seq-len {max_seq_len}")
    if verify_max != max_draft_tokens + 1:
        raise ManifestError(f"manifest key 'max_draft_tokens' is {max_draft_tokens} but {key} was compiled for "
                            f"{verify_max - 1} (profiles); recompile with --max-draft-tokens {max_draft_tokens}")


def available_memory() -> int:
    """Bytes of memory available to a new allocation: Linux's MemAvailable (what psutil reports there, without
    importing psutil on every load), else psutil's figure."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return psutil.virtual_memory().available


def check_memory(manifest: "Manifest") -> None:
    """The KV caches `load` preallocates must fit in available memory (no MemoryError mid-load)."""
    total = 0
    for entry in manifest.models.values():
        c = entry.decoder_config
        total += 2 * c.num_layers * manifest.max_seq_len * c.num_kv_heads * c.head_dim * 4
    available = available_memory()
    if total > available:
        raise ManifestError(f"manifest max_seq_len {manifest.max_seq_len} needs {total / 2**30:.1f} GiB of KV cache, "
                            f"{available / 2**30:.1f} GiB are available")


# ----------------------------------------------------------------------------------------- files
def check_file_list(files: Any, referenced: Mapping[str, str]) -> None:
    """The file list is non-empty and lists every path the manifest references (`referenced`: key -> path)."""
    if not isinstance(files, Mapping) or not files:
        raise ManifestError("manifest has no file list ('files' is empty): nothing could be verified; "
                            "recompile the bundle")
    for key, rel in referenced.items():
        if not isinstance(rel, str) or rel not in files:
            raise ManifestError(f"manifest key {key} names {rel!r}, which is not in the manifest's file list "
                                "(unverified files are not opened); recompile the bundle")


def graph_variants(manifest: "Manifest") -> Iterator[tuple[str, str, Any, Any, Any, bool]]:
    """(manifest key, relative path, model entry or None, variant or None, declared (inputs, outputs) or None,
    quantized slot) for every graph the runtime can open: each model's portable graph, every
    `graphs.<variant>`, every `quantization.graphs.<variant>` (declaring the I/O of the fp32 variant of the same
    name), the Medusa heads and the draft head."""
    def declared(entry, variant):
        if variant is not None and variant.inputs is not None:
            return variant.inputs, variant.outputs
        return (entry.inputs, entry.outputs) if variant is None or variant.kv_layout is None else None

    for role, entry in manifest.models.items():
        key = f"models.{role}"
        fp32 = dict(entry.graphs or {})
        if "portable" not in entry.omitted:  # a lean bundle left out (entries.OMITTABLE)
            yield key, entry.onnx, entry, None, declared(entry, None), False
        for name, variant in fp32.items():
            if name not in entry.omitted:
                yield f"{key}.graphs.{name}", variant.onnx, entry, variant, declared(entry, variant), False
        if entry.quantization is not None:
            for name, variant in entry.quantization.graphs.items():
                if f"quantized.{name}" in entry.omitted:
                    continue
                io = declared(entry, variant) if variant.inputs is not None else declared(entry, fp32.get(name))
                yield f"{key}.quantization.graphs.{name}", variant.onnx, entry, variant, io, True
    if manifest.medusa is not None:
        yield "medusa", manifest.medusa.onnx, None, None, None, False
    if manifest.draft_head is not None:
        head = manifest.draft_head
        yield "draft_head", head.onnx, None, None, (head.inputs, head.outputs) if head.outputs else None, False


def check_graphs(root: Path, manifest: "Manifest") -> None:
    """Every graph variant the runtime can open passes the same checks: it parses, every external-data file it
    names is listed (and so verified) and inside the bundle, its inputs and outputs are the ones its manifest
    entry declares (names, dtypes, fixed sizes: layers, KV heads, head size, vocabulary), and its precision is
    the slot's (MatMulNBits in a quantized slot, as many as recorded; none in an fp32 slot). The graphs are read
    by `graph_scan` (no `import onnx` on the load path); each file is scanned once."""
    scanned: dict[str, GraphFacts] = {}
    for key, rel, entry, variant, io, quantized in graph_variants(manifest):
        if rel not in scanned:
            try:
                scanned[rel] = scan_graph(resolve_inside(root, rel))
            except BundleError:
                raise
            except (GraphScanError, OSError) as exc:
                raise BundleError(f"bundle file {rel} ({key}) is not a readable ONNX graph ({type(exc).__name__}); "
                                  "recompile the bundle") from None
        facts = scanned[rel]
        check_external_data(facts, key, rel, manifest.files)
        if entry is None:  # the Medusa heads, the draft head: the I/O they declare (the head's logits: V' wide)
            if io is not None:
                check_declared_io(facts, key, rel, io)
            if key == "draft_head":
                check_head_precision(facts, rel, manifest.draft_head)
            continue
        if io is not None and io[0] is not None and any(s.name == "position_ids" for s in io[0]):
            check_graph_shapes(facts, entry.decoder_config, key, rel)  # the portable layout
        if io is not None:
            check_declared_io(facts, key, rel, io)
        if variant is not None:
            check_precision(facts, key, rel, variant, quantized)
        if quantized:
            check_quantized_graph(facts, key, rel, entry.quantization, f"models.{entry.role}.quantization")


def check_external_data(facts: GraphFacts, key: str, rel: str, files: Mapping[str, Any]) -> None:
    folder = Path(rel).parent
    for loc in sorted(facts.external_locations):
        ref = (folder / loc).as_posix()
        if ".." in Path(loc).parts or Path(loc).is_absolute() or ref not in files:
            raise ManifestError(f"{rel} ({key}) reads external data {loc!r}, which is not a listed bundle file; "
                                "recompile the bundle")
        end, size = facts.external_ends.get(loc, 0), getattr(files[ref], "size", None)
        if isinstance(size, int) and end > size:  # the sizes were checked against the files: a truncated one
            raise ManifestError(f"{rel} ({key}) reads {end} bytes of {ref}, which holds {size}: the data file was "
                                "truncated or belongs to another graph; recompile the bundle")


def check_declared_io(facts: GraphFacts, key: str, rel: str, declared: tuple[Any, Any]) -> None:
    """The graph's inputs and outputs against the specs its manifest entry declares (when it declares them)."""
    for kind, specs, values in (("input", declared[0], facts.inputs), ("output", declared[1], facts.outputs)):
        if specs is None:
            continue
        actual = {v.name: v for v in values}
        for spec in specs:
            v = actual.get(spec.name)
            if v is None:
                raise ManifestError(f"{rel} ({key}) has no {kind} {spec.name!r} that the manifest declares: the graph "
                                    "belongs to another model or bundle; recompile it")
            if spec.dtype is not None and v.dtype != spec.dtype:
                raise ManifestError(f"{rel} ({key}) {kind} {spec.name} is {v.dtype}, the manifest declares "
                                    f"{spec.dtype}; recompile the bundle")
            dims, want = list(v.dims), list(spec.shape)
            if len(dims) != len(want) or any(isinstance(w, int) and d is not None and d != w
                                             for d, w in zip(dims, want)):
                raise ManifestError(f"{rel} ({key}) {kind} {spec.name} has shape {dims}, the manifest declares "
                                    f"{want}: the graph belongs to another model or bundle; recompile it")


def check_precision(facts: GraphFacts, key: str, rel: str, variant: Any, quantized: bool) -> None:
    """MatMulNBits in a quantized slot (as many as recorded), none in an fp32 slot."""
    n = facts.op_counts.get("MatMulNBits", 0)
    if quantized and (n == 0 or (variant.quantized_matmuls is not None and n != variant.quantized_matmuls)):
        raise ManifestError(f"{rel} ({key}) has {n} quantized MatMuls, the manifest records "
                            f"{variant.quantized_matmuls}: not the quantized graph this slot was compiled with; "
                            "recompile the bundle")
    if not quantized and n:
        raise ManifestError(f"{rel} ({key}) is a quantized graph ({n} MatMulNBits) in an fp32 slot; recompile the "
                            "bundle")


def check_graph_shapes(facts: GraphFacts, config, key: str, rel: str) -> None:
    """Layers, KV heads, head size and vocabulary of the graph against `key`.decoder_config."""
    inputs = {v.name: list(v.dims) for v in facts.inputs}
    outputs = {v.name: list(v.dims) for v in facts.outputs}
    layers = sum(1 for name in inputs if name.startswith("past_key."))
    found = {"num_layers": layers}
    if "past_key.0" in inputs and len(inputs["past_key.0"]) == 4:
        found["num_kv_heads"], found["head_dim"] = inputs["past_key.0"][2], inputs["past_key.0"][3]
    if "logits" in outputs and len(outputs["logits"]) == 3:
        found["vocab_size"] = outputs["logits"][2]
    if "hidden_states" in outputs and len(outputs["hidden_states"]) == 3:
        found["hidden_size"] = outputs["hidden_states"][2]
    for name, value in found.items():
        want = getattr(config, name)
        if value is not None and value != want:
            raise ManifestError(f"manifest key {key}.decoder_config.{name} is {want} but the graph {rel} has "
                                f"{value}; the manifest was edited or belongs to another bundle: recompile it")
