"""ringtrain.Loader: the C loader's batches as torch tensors, straight from its ring of slots."""

import operator
import os
import time

from . import _ringtrain


def _launcher_rank_world():
    """(rank, world) from torch.distributed when it is initialised, else the launcher's variables."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover - torch is required by Loader anyway
        pass
    # Slurm: the tasks of this srun step (SLURM_STEP_NUM_TASKS exists inside a step only). A python that the
    # batch shell starts itself sees SLURM_PROCID 0 and the job's SLURM_NTASKS: it is a world of one, not
    # rank 0 of the job.
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def _shuffle_mode(shuffle):
    if shuffle is True:
        return "exact"
    if shuffle is False or shuffle is None:
        return "none"
    if shuffle in ("exact", "window", "none"):
        return shuffle
    raise ValueError(f"shuffle must be True, False, 'exact', 'window' or 'none', not {shuffle!r}")


class _Sampler:
    """A Loader's `sampler`, as DataLoader's: what frameworks call on it (set_epoch, len) goes to the
    loader, whose C sampler orders the batches."""

    def __init__(self, loader):
        self._loader = loader

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    def __len__(self):
        return len(self._loader) * self._loader.batch_size


class Loader:
    """Batches of a packed dataset as torch tensors, from ringtrain's C loader.

    ``for images, labels in loader`` yields uint8 images (B, C, H, W) and int64 labels (B,) for one epoch;
    the next ``for`` is the next epoch, also after one left early (as a DataLoader's; set_epoch() chooses
    another; after load_state_dict() the first ``for`` finishes the resumed epoch). The batches are the C loader's, bit for bit: the order
    depends only on (seed, epoch, world_size, rank), the augmentation of a sample only on (seed, epoch,
    sample id), never on `workers` or timing -- the same as ``ringtrain train`` and ``ringtrain loadbench``
    with the same options (with digest=True, ``loader.digest()`` equals ``loadbench --digest``).

    data         a packed dataset directory (``ringtrain pack`` / ringtrain.pack(); see ringtrain.stage()).
    batch_size   samples per batch on this rank.
    split        "train", "val" or "test".
    shuffle      True ("exact": a fresh permutation of the split every epoch), False ("none": record order),
                 or "window" (block-window shuffling for data larger than RAM).
    drop_last    True: every batch full, the tail of the epoch dropped. False: every sample exactly once
                 across the ranks; the last batch of a rank may be shorter.
    seed         sample order and augmentation.
    augment      "default": what ``ringtrain train`` does -- "crop+flip" on the training split of 3-channel
                 data, "none" on val/test and on other data (crops and flips suit photos, not digits).
                 Else "none" or named operations, comma- (or '+'-) separated, run in the C workers on the
                 uint8 images in this order whatever the order written (``ringtrain train --aug`` spells them
                 the same way):
                   crop[=PAD]       RandomCrop(size, padding=PAD (4)); variable-size images: RandomResizedCrop
                                    (see image_size; "crop-scale=A:B", "crop-ratio=A:B" set its ranges
                                    as crop_scale/crop_ratio do, and win over them); "reflect" pads by
                                    reflection
                   flip             RandomHorizontalFlip(); "alternate-flip": flipped every other epoch
                   brightness=V, contrast=V, saturation=V, jitter=V (all three)
                                    ColorJitter(brightness=V, ...), in a random order per sample as
                                    ColorJitter's; the values of torchvision's functions on uint8, bit for bit
                   erase[=P[:SMIN:SMAX[:RMIN:RMAX]]]
                                    RandomErasing(p=P (0.5), scale=(SMIN, SMAX), ratio=(RMIN, RMAX)), the
                                    rectangle set to the data's mean colour (0 once normalised, as
                                    RandomErasing(value=0) after Normalize)
                   cutout=SIZE      Cutout: a SIZE x SIZE square on a random centre, clipped, the mean colour
                 "crop+flip" is the CIFAR recipe. Each operation draws from (seed, epoch, sample) alone;
                 ``ringtrain._ringtrain.aug_draw(augment, seed, epoch, sample, height, width)`` shows the
                 draws. Anything else (a hue shift, your own code): ``transform`` on the batch.
    workers      decode/augment threads (None: the CPUs this process may use; 0, DataLoader's main-process
                 loading, is one thread: the C loader always decodes in its own threads).
    rank, world_size  None: torch.distributed's when initialised, else RANK/WORLD_SIZE (torchrun),
                 SLURM_PROCID/SLURM_STEP_NUM_TASKS (inside srun; a python the batch
                 shell starts is a world of one), OMPI_COMM_WORLD_RANK/_SIZE (mpirun), else 0 and 1.
                 Every rank gets the same number of batches.
    device       "cpu": images that are views of the ring's slots (no copy), labels a copy. "cuda" (or
                 a torch.device): the slots are page-locked and each batch is copied to the GPU
                 asynchronously on a side stream, one batch ahead; the tensors yielded are on the GPU.
    slots        batches the ring holds (None: workers + 2, at least 4; 2 more on a GPU).
    digest       keep the XXH3 of every batch for digest() (it reads each whole batch once more).
    image_size   S: the batches are uint8 (B, C, S, S) (``loader.shape`` (C, S, S)). Required for datasets
                 packed with ``--codec jpeg --max-side N`` (images of their own sizes; ringtrain.Error
                 otherwise); a fixed-size dataset takes None or its own size. Variable-size images are cropped as torchvision does:
                 split "train" with augment="crop+flip" (the default for 3-channel images):
                 RandomResizedCrop(S, scale=crop_scale, ratio=crop_ratio) + RandomHorizontalFlip; "val"/"test",
                 or augment="none":
                 Resize(round(S / center_ratio)) + CenterCrop(S), flipped at random with "crop+flip". The same crops as ``ringtrain train`` and
                 ``ringtrain loadbench --image-size S`` with the same options.
    crop_scale, crop_ratio  RandomResizedCrop's area fraction and aspect (w/h) ranges, (min, max).
    center_ratio the centre crop's share of the resized image (0.875: Resize(256) + CenterCrop(224)).
                 The three crop options matter only for variable-size datasets.

    What the batches become at hand-over, once (the ring's slots stay uint8 CHW); on the CPU in C, with
    the trainer's own expression (bit for bit its input in float32), on the GPU with torch after the copy:
    normalize    False; True: (x / 255 - mean) / std with the normalisation ``ringtrain train`` applies (the
                 manifest's mean and std, else its defaults: ``loader.input_mean``/``input_std``); or a pair
                 (mean, std) of per-channel sequences on the [0, 1] scale, as torchvision's Normalize.
    dtype        torch.uint8 (None without normalize), torch.float32 (None with it) or torch.bfloat16; a
                 float without normalize is x / 255, as ToTensor.
    channels_last  the images in torch.channels_last memory format (NHWC strides).
    transform    a callable (images, labels) -> (images, labels) run on each batch after the above, on
                 its device: where a script's own per-batch logic goes (vectorised, not per sample).
    pin_memory   device="cpu": the batches in page-locked memory (a copy, as DataLoader's pin_memory).
    A converted or pinned CPU batch is a tensor of its own: it holds no ring slot.

    Lifetime (device="cpu"): a batch's slot goes back to the loader when its last tensor is freed, so a
    batch you keep keeps its values. Batch n lives in slot n % slots: a batch may be kept while `slots - 1`
    later batches are taken; the next() that needs its slot again raises ringtrain.Error (errno EBUSY) --
    never a deadlock, never an overwrite. Keep a copy (``images.clone()``) of what you store for longer,
    or pass a larger `slots`.
    """

    def __init__(self, data, batch_size, split="train", shuffle=True, drop_last=True, seed=0,
                 augment="default", workers=None, rank=None, world_size=None, device="cpu", slots=None,
                 digest=False, image_size=None, crop_scale=(0.08, 1.0), crop_ratio=(3 / 4, 4 / 3),
                 center_ratio=0.875, normalize=False, dtype=None, channels_last=False, transform=None,
                 pin_memory=False):
        # What builds it again (pickle, copy.deepcopy): the arguments as given (first: locals() is them alone).
        self._args = {k: v for k, v in locals().items() if k != "self"}
        import torch
        from torch.utils.dlpack import from_dlpack

        self._torch = torch
        self._from_dlpack = from_dlpack
        self._digest = bool(digest)
        self.data = os.fspath(data)
        if isinstance(batch_size, bool) or operator.index(batch_size) < 1:  # 64.7: TypeError, not 64
            raise ValueError(f"batch_size must be at least 1, not {batch_size!r}")
        self.batch_size = operator.index(batch_size)
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', not {split!r}")
        self.split = split
        self.shuffle = _shuffle_mode(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = int(seed)
        if not isinstance(augment, str):  # the spelling itself is the C loader's to check (ValueError)
            raise TypeError(f"augment must be a str such as 'crop,flip,jitter=0.4', not {augment!r}")
        self.augment = augment
        if workers is not None and int(workers) < 0:
            raise ValueError(f"workers must be at least 0 (or None for the CPUs), not {workers!r}")
        # 0, DataLoader's "in the main process", is one worker thread: the C loader always decodes in threads.
        self.workers = 0 if workers is None else max(int(workers), 1)
        if rank is None or world_size is None:
            r, w = _launcher_rank_world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        self.rank, self.world_size = int(rank), int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..world_size-1 (world_size {self.world_size})")
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device")
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        self._slots = 0 if slots is None else int(slots)
        if slots is not None and self._slots < 3:
            raise ValueError(f"slots must be at least 3, not {slots!r}")

        if image_size is not None and not 1 <= int(image_size) <= 4096:
            raise ValueError(f"image_size must be None or in 1..4096, not {image_size!r}")
        self.image_size = None if image_size is None else int(image_size)
        self._crop = dict(crop_scale=tuple(crop_scale), crop_ratio=tuple(crop_ratio),
                          center_ratio=float(center_ratio))
        info = _ringtrain.dataset_info(self.data)
        self._records = int(info["splits"][self.split])  # of the split: the length of an epoch's global sequence
        self.variable = bool(info["variable"])
        # The slots' shape, as the C loader makes it (the stored size, or S x S): Error when image_size is
        # missing for variable-size images, or is not a fixed-size dataset's own size.
        self.shape = tuple(_ringtrain.image_shape(self.data, self.image_size))
        self.classes = list(info["classes"])
        self.mean, self.std = info.get("mean"), info.get("std")
        #: the normalisation the trainer applies (the manifest's, else its defaults): normalize=True's
        self.input_mean, self.input_std = list(info["input_mean"]), list(info["input_std"])
        self._handover(torch, normalize, dtype, channels_last, transform, pin_memory)
        self._core = None
        self._memory = None
        self._pending = []      # device="cuda": (CBatch, event) handed out, host slot not yet released
        self._ahead = None      # device="cuda": (CBatch, event, block, images, labels) of the next batch, copying
        self._events = []       # device="cuda": events whose batch is released, recorded again for another
        self._epoch = 0         # the next batch to hand to the user
        self._step = 0
        self._resumed = None    # load_state_dict's (epoch, step) until the first batch after it
        # (epoch, first, base, end): the epoch load_state_dict started at global position `first` (a state of
        # another world or batch size), whose steps are numbered from base = first // G up to end; None: none
        self._origin = None
        self._closed = False
        self._wait_ns = 0       # time the consumer spent blocked in next()
        self._batches = 0
        self._open(0, 0)

    def _handover(self, torch, normalize, dtype, channels_last, transform, pin_memory):
        """Checks and keeps what the batches become at hand-over (normalize, dtype, ...)."""
        if normalize is True:
            norm = (self.input_mean, self.input_std)
        elif normalize is False or normalize is None:
            norm = None
        else:
            mean, std = normalize
            norm = ([float(v) for v in mean], [float(v) for v in std])
            c = self.shape[0]
            if len(norm[0]) != c or len(norm[1]) != c or min(norm[1]) <= 0:
                raise ValueError(f"normalize: (mean, std) with {c} values each, std positive, not {normalize!r}")
        if dtype is None:
            dtype = torch.float32 if norm else torch.uint8
        if dtype not in (torch.uint8, torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be torch.uint8, torch.float32 or torch.bfloat16, not {dtype!r}")
        if norm and dtype == torch.uint8:
            raise ValueError("normalize needs a float dtype (torch.float32 or torch.bfloat16)")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable (images, labels) -> (images, labels), not {transform!r}")
        self.dtype, self.channels_last, self.transform = dtype, bool(channels_last), transform
        # As DataLoader: pinning needs CUDA; without it the option is ignored with a warning.
        self.pin_memory = bool(pin_memory) and not self._cuda and torch.cuda.is_available()
        if pin_memory and not self._cuda and not self.pin_memory:
            import warnings

            warnings.warn("ringtrain.Loader: pin_memory=True but torch has no CUDA device: not pinned", stacklevel=3)
        self._norm = norm or ([0.0] * self.shape[0], [1.0] * self.shape[0])  # float without normalize: x / 255
        self._norm_dev = None  # device="cuda": the two as (1, C, 1, 1) tensors on the GPU, made at the first batch
        self._convert = dtype != torch.uint8
        # device="cpu": the C converter, its constants checked once; a batch is split over the calling thread
        # and threads of its own (started at the first batch, asleep between batches)
        self._converter = None
        if self._convert and not self._cuda:
            self._converter = _ringtrain.Converter(*self._norm, bf16=dtype == torch.bfloat16,
                                                   channels_last=self.channels_last,
                                                   threads=self._convert_threads())

    def _convert_threads(self):
        """Threads a batch's conversion is split over: the CPUs the loader's workers use (they wait for a
        free slot while the consumer converts), at most 8."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(self.workers or cpus, cpus, 8))

    def _cpu_images(self, cb):
        """The batch's images as the hand-over options make them: a view of the slot (uint8, nothing asked),
        else a tensor of its own filled in C (float) or copied (uint8 pinned or channels_last)."""
        torch = self._torch
        if not (self._convert or self.pin_memory or self.channels_last):
            return self._from_dlpack(cb.images())
        if self._convert and not self.pin_memory:
            # In the converter's own memory, laid out as asked: a buffer torch freed is filled again, not a fresh
            # allocation whose pages fault in on every batch.
            return self._from_dlpack(self._converter.tensor(cb))
        b, (c, h, w) = cb.batch, self.shape
        # One allocation, pinned when asked, laid out NHWC for channels_last (the view is NCHW either way).
        mem = torch.empty((b, h, w, c) if self.channels_last else (b, c, h, w), dtype=self.dtype,
                          pin_memory=self.pin_memory)
        out = mem.permute(0, 3, 1, 2) if self.channels_last else mem
        if self._convert:
            self._converter.run(cb, out.data_ptr())
        else:
            out.copy_(self._from_dlpack(cb.images()))
        return out

    def _gpu_handover(self, images):
        """device="cuda": the uint8 batch on the GPU as the hand-over options make it (the same expression as
        the C one, in float32, then rounded to the dtype)."""
        torch = self._torch
        if self._convert:
            if self._norm_dev is None:  # uploaded once, not a blocking copy per batch
                self._norm_dev = tuple(torch.tensor(v, device=images.device).view(1, -1, 1, 1) for v in self._norm)
            mean, std = self._norm_dev
            images = ((images.float() / 255.0 - mean) / std).to(self.dtype)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    # ---- the C loader -------------------------------------------------------------------------
    @property
    def _global_batch(self):
        """G: the samples one step takes from the epoch's global sequence, over all ranks."""
        return self.batch_size * self.world_size

    def _open(self, epoch, step):
        """(Re)start the C loader at batch (epoch, step). In the epoch load_state_dict() started at a global
        position (self._origin), `step` is of that start's numbering and the C loader starts at the position
        of that step; at the end of such an epoch (a global batch of this loader finds nothing left of it)
        the C loader starts at the next epoch, and the loader stays at the empty epoch until its ``for``."""
        epoch, step = int(epoch), int(step)
        self._drop_core()
        o = self._origin if self._origin is not None and self._origin[0] == epoch else None
        self._origin = o
        empty = o is not None and step >= o[3]
        start_epoch, start_step, start_sample = epoch, step, 0
        if empty:
            start_epoch, start_step = epoch + 1, 0
        elif o is not None:
            start_step, start_sample = 0, o[1] + (step - o[2]) * self._global_batch
        kwargs = dict(split=self.split, batch=self.batch_size, shuffle=self.shuffle,
                      last="drop" if self.drop_last else "pad", seed=self.seed, augment=self.augment,
                      workers=self.workers, rank=self.rank, world=self.world_size, start_epoch=start_epoch,
                      start_step=start_step, start_sample=start_sample, epochs=0, digest=self._digest,
                      image_size=self.image_size, **self._crop)
        slots = self._slots
        if self._cuda:
            torch = self._torch
            if not slots:
                slots = max(self.workers + 2, 4) + 2
            c, h, w = self.shape
            nbytes = _ringtrain.ring_bytes(slots, self.batch_size, c, h, w)
            if self._memory is None or self._memory.numel() != nbytes:
                # Page-locked by torch's own host allocator: the copies below run asynchronously.
                self._memory = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            kwargs["memory"] = (self._memory.data_ptr(), nbytes, self._memory)
            self._stream = torch.cuda.Stream(device=self.device)
        kwargs["slots"] = slots
        self._core = _ringtrain.open_loader(self.data, **kwargs)
        self._max_pending = max(self._core.slots - 3, 0)
        self._full_steps = self._core.steps_per_epoch
        self._steps = o[3] if empty else self._core.epoch_steps(epoch)  # the current epoch's end
        self._epoch, self._step = epoch, step
        self._taken = (epoch + 1, 0) if empty else (epoch, step)  # the next batch the C loader hands out

    def _drop_core(self):
        if self._ahead is not None:
            self._pending.append(self._ahead[:2])
            self._ahead = None
        for cb, ev in self._pending:
            ev.synchronize()
            cb.release()
            self._events.append(ev)
        self._pending = []
        if self._core is not None:
            self._core.close()
            self._core = None

    def _take(self):
        """The next CBatch from the C loader, its wait counted as the consumer's."""
        if self._core is None:
            raise ValueError("ringtrain.Loader: iterating a closed loader")
        t0 = time.perf_counter_ns()
        cb = self._core.next()
        self._wait_ns += time.perf_counter_ns() - t0
        if cb is None:  # the C loader runs until closed: an end here is a bug, not the end of an epoch
            raise _ringtrain.Error(5, "ringtrain.Loader: the C loader ended unexpectedly")
        e, s = self._taken
        if (cb.epoch, cb.step) != (e, s):
            raise _ringtrain.Error(5, f"ringtrain.Loader: expected batch (epoch {e}, step {s}), got "
                                      f"(epoch {cb.epoch}, step {cb.step})")
        self._taken = self._after((e, s))
        return cb

    def _cpu_batch(self, cb):
        images = self._cpu_images(cb)
        # The labels are copied (B int64s): kept for evaluation (targets.append(y)), they hold no slot.
        labels = self._from_dlpack(cb.labels()).clone()
        valid = cb.valid
        cb.release()  # the tensors hold the slot now (none: a converted or pinned batch is a copy)
        if valid < images.shape[0]:
            images, labels = images[:valid], labels[:valid]
        return images, labels

    def _cuda_start(self, cb):
        """Start copying `cb` to the GPU on the side stream: (CBatch, event, GPU block, GPU images, GPU labels).

        One copy per batch: a slot holds its images, then (page-aligned) its labels, so the block from the
        first image byte to the last label byte goes over at once and both tensors are views of it. The
        event comes from a pool of those whose batch was released."""
        torch = self._torch
        c, h, w = self.shape
        b = cb.batch
        base = self._memory.data_ptr()
        io = cb.images_address() - base
        lo = cb.labels_address() - base
        with torch.cuda.stream(self._stream):
            block = self._memory[io:lo + 8 * b].to(self.device, non_blocking=True)
            ev = self._events.pop() if self._events else torch.cuda.Event()
            ev.record(self._stream)
        images = block[:b * c * h * w].view(b, c, h, w)
        labels = block[lo - io:].view(torch.int64)
        if cb.valid < b:
            images, labels = images[:cb.valid], labels[:cb.valid]
        return cb, ev, block, images, labels

    def _cuda_batch(self):
        """The next batch on the GPU. Its copy was started one call earlier (on the side stream), and the
        copy of the batch after it starts now, so the host-to-device transfer overlaps the user's step."""
        torch = self._torch
        # A slot goes back to the C loader once its copy is done. Batch n sits in slot n % slots, so the
        # batch the C loader is asked for next needs the slot of the one `slots` before it: with the batch
        # ahead and that one, fewer than slots - 2 copies may still be outstanding; wait for the oldest
        # beyond that (rarely: a copy takes tens of microseconds).
        pending = self._pending
        while pending and (len(pending) > self._max_pending or pending[0][1].query()):
            cb, ev = pending.pop(0)
            ev.synchronize()
            cb.release()
            self._events.append(ev)
        if self._ahead is None:
            self._ahead = self._cuda_start(self._take())
        cb, ev, block, images, labels = self._ahead
        self._ahead = None
        self._pending.append((cb, ev))
        # Not past the epoch's end: set_epoch() or load_state_dict() may move the loader there, and at an
        # epoch's end digest() then covers exactly the batches handed out.
        if self._step + 1 < self._steps:
            self._ahead = self._cuda_start(self._take())
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(ev)
        block.record_stream(cur)  # allocated on the side stream, used on the user's (images and labels are views)
        return images, labels

    # ---- iteration ------------------------------------------------------------------------------
    def __len__(self):
        """The batches of the current epoch: the end of its step numbers, the same on every rank. After
        load_state_dict() the resumed ``for`` yields len() - state_dict()["step"] of them; an epoch continued
        from another world or batch size (its steps numbered from where its position falls among this
        loader's batches) may end one step before the others."""
        return self._steps

    def __iter__(self):
        if self._closed:
            raise ValueError("ringtrain.Loader: iterating a closed loader")
        if self._step >= self._steps:
            # Resumed (from another world or batch size) where no global batch of this loader is left in the
            # epoch: its ``for`` yields nothing, and the C loader waits at the next epoch's start.
            self._epoch, self._step, self._resumed, self._origin = self._epoch + 1, 0, None, None
            if self._core is None:
                self._open(self._epoch, 0)
            self._steps = self._core.epoch_steps(self._epoch)
            return
        # Each iteration is one epoch, as a DataLoader's: one left early (a break, next(iter(loader))) gives
        # up the rest of its epoch, and this one is the next epoch's. A resumed position (load_state_dict)
        # is the exception: its first iteration finishes the resumed epoch.
        if self._step and self._resumed is None:
            self._open(self._epoch + 1, 0)
        elif self._core is None:  # an exception (Ctrl-C) inside _open left none
            self._open(self._epoch, self._step)
        else:
            self._resync()
        while True:
            if self._cuda:
                images, labels = self._cuda_batch()
                images = self._gpu_handover(images)
            else:
                images, labels = self._cpu_batch(self._take())
            if self.transform is not None:
                images, labels = self.transform(images, labels)
            self._batches += 1
            self._resumed = None
            self._step += 1
            last = self._step == self._steps
            if last:
                self._epoch, self._step, self._origin = self._epoch + 1, 0, None
                self._steps = self._core.epoch_steps(self._epoch)
            yield images, labels
            del images, labels  # the slot must not stay referenced by this frame
            if last:
                return

    def _after(self, pos):
        e, s = pos
        return (e, s + 1) if s + 1 < self._core.epoch_steps(e) else (e + 1, 0)

    def _resync(self):
        """A batch taken from the C loader but never handed out -- an exception between the two, such as
        the KeyboardInterrupt of a Ctrl-C, which Python raises as the C call returns -- is made again: the
        C loader reopens where the user is (the batches depend on the position alone)."""
        st = self._core.state()
        taken = (st["epoch"], st["step"])  # the C loader's next batch (Python's own count may lag it)
        want = (self._epoch, self._step)
        if self._ahead is not None:  # device="cuda": the batch being copied is the next one handed out
            ok = (self._ahead[0].epoch, self._ahead[0].step) == want and taken == self._after(want)
        else:
            ok = taken == want
        if ok:
            self._taken = taken
        else:
            self._open(*want)

    # ---- epochs and resume ----------------------------------------------------------------------
    def set_epoch(self, epoch):
        """Start the next iteration at the beginning of `epoch` (as DistributedSampler.set_epoch).

        Free when it is where the loader already is (after a whole epoch, the next one); otherwise the C
        loader restarts at that epoch. After load_state_dict(), until its first batch, set_epoch() of the
        resumed epoch keeps the resumed position: the usual ``set_epoch(epoch)`` at the top of a resumed
        epoch does not train on that epoch's first batches again.
        """
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        if self._resumed is not None and epoch == self._resumed[0]:
            return
        if (epoch, 0) != (self._epoch, self._step) or self._origin is not None:
            self._origin = None  # the whole epoch, not the rest of a resumed one
            self._open(epoch, 0)

    @property
    def epoch(self):
        return self._epoch

    # ---- DataLoader's attributes, for scripts and frameworks that read them ------------------------
    @property
    def sampler(self):
        """Has set_epoch(e) (this loader's) and len(): what a framework calls on a DataLoader's sampler.
        The same object every time, as a DataLoader's."""
        if getattr(self, "_sampler", None) is None:
            self._sampler = _Sampler(self)
        return self._sampler

    @property
    def batch_sampler(self):
        """None, as a DataLoader's without a batch sampler: the C loader makes the batches (Lightning 2.5 and
        later read it to tell whether a loader shuffles)."""
        return None

    @property
    def dataset(self):
        """The split as a ringtrain.Dataset (len(), random access to its records), made on first use."""
        if getattr(self, "_dataset", None) is None:
            from ._dataset import Dataset

            self._dataset = Dataset(self.data, self.split)
        return self._dataset

    def state_dict(self):
        """The position of the next batch, with what fixes the order: resume with load_state_dict().

        epoch, step   the next batch (step in this loader's numbering: the same on every rank);
        sample        shuffle "exact"/"none": where the next batch starts in the epoch's global sequence (the
                      same on every rank; the first of step's batch_size x world_size positions), which
                      carries the position to another world or batch size; None for "window" (no global
                      order: each rank reads its own blocks);
        version       2: states without "sample" are from before the global order;
        and the seed, world_size, rank, batch_size, shuffle, drop_last, augment, split and image_size.
        """
        o = self._origin
        if self.shuffle == "window":
            sample = None  # no global order: each rank reads its own blocks
        elif o is not None and o[0] == self._epoch:
            sample = o[1] + (self._step - o[2]) * self._global_batch
        else:
            sample = self._step * self._global_batch
        return {"version": 2, "epoch": self._epoch, "step": self._step, "sample": sample, "seed": self.seed,
                "world_size": self.world_size, "rank": self.rank, "batch_size": self.batch_size,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "augment": self.augment, "split": self.split,
                "image_size": self.image_size}

    def load_state_dict(self, state):
        """Continue from `state` (a state_dict(), of any rank): the next iteration yields the rest of that epoch.

        Same world size and batch size: the batches are exactly those an uninterrupted loader would have
        yielded, bit for bit (the rank must be the state's too). Another world size or batch size (shuffle
        "exact" or "none"): the epoch's global sequence goes on from the state's "sample" with this loader's
        batches -- every sample the old run had not reached, once across the ranks, as this loader's
        uninterrupted run from that position yields them; drop_last=True leaves out the last records that do
        not fill a batch_size x world_size global batch (none at all if fewer than that are left: the
        resumed ``for`` is empty), drop_last=False yields every remaining record once. The shuffle, last-batch
        rule, augmentation, split and image size must match this loader's; the seed is taken from `state`.
        ValueError for a mismatch, for shuffle="window" with another world or batch size mid-epoch (its order
        depends on the world size; at an epoch's start any will do), and for a state without "sample" (from
        before the global order) saved at a world size above 1 with shuffle "exact"/"none" (its position has
        no place in today's order).
        """
        missing = [k for k in ("epoch", "step") if k not in state]
        if missing:
            raise ValueError(f"ringtrain.Loader.load_state_dict: the state has no {' or '.join(missing)} "
                             f"(a Loader.state_dict() is expected)")
        mine = self.state_dict()
        for k in ("shuffle", "drop_last", "augment", "split", "image_size"):
            if k in state and state[k] != mine[k]:
                raise ValueError(f"ringtrain.Loader.load_state_dict: {k} is {state[k]!r} in the state but "
                                 f"{mine[k]!r} in this loader")
        epoch, step = int(state["epoch"]), int(state["step"])
        world, batch = int(state.get("world_size", self.world_size)), int(state.get("batch_size", self.batch_size))
        same = (world, batch) == (self.world_size, self.batch_size)
        window = self.shuffle == "window"
        if "sample" in state:
            sample = None if state["sample"] is None else int(state["sample"])
        elif window:
            sample = None
        elif world > 1:
            raise ValueError(f"ringtrain.Loader.load_state_dict: the state has no global position (\"sample\"): "
                             f"it is from an older ringtrain, whose {world} ranks each read their own part of the "
                             f"epoch; that position has no place in today's global order, which serves every world "
                             f"size: start epoch {epoch} again (set_epoch({epoch}))")
        else:
            sample = step * batch  # one rank's order then was the whole sequence, today's too
        if (same and (window or sample == step * self._global_batch)) or (window and step == 0):
            if same and "rank" in state and state["rank"] != self.rank:
                raise ValueError(f"ringtrain.Loader.load_state_dict: rank is {state['rank']!r} in the state but "
                                 f"{self.rank!r} in this loader")
            if not 0 <= step < self._full_steps:
                raise ValueError(f"ringtrain.Loader.load_state_dict: step {step} is not in "
                                 f"0..{self._full_steps - 1}")
            origin = None
        elif window:
            raise ValueError(f"ringtrain.Loader.load_state_dict: shuffle='window' orders an epoch by the world size "
                             f"(each rank reads its own blocks): a state of world_size {world}, batch_size {batch} "
                             f"does not carry over to world_size {self.world_size}, batch_size {self.batch_size}; "
                             f"use shuffle='exact' or 'none' to change them mid-epoch, or start the epoch again")
        elif sample is None or not 0 <= sample < self._records:
            raise ValueError(f"ringtrain.Loader.load_state_dict: sample {sample!r} is not a position in the "
                             f"{self._records} records of split {self.split!r}")
        elif sample == 0:
            step, origin = 0, None
        else:
            G = self._global_batch
            left = self._records - sample
            step = sample // G
            origin = (epoch, sample, step, step + (left // G if self.drop_last else -(-left // G)))
        self.seed = int(state.get("seed", self.seed))
        self._origin = origin
        self._open(epoch, step)
        self._resumed = (epoch, step)

    # ---- figures --------------------------------------------------------------------------------
    def stats(self):
        """Where the loader's time went: the C loader's stage figures (as `ringtrain loadbench` prints
        them), the ring's waits, and the consumer's time blocked in next()."""
        s = dict(self._core.stats()) if self._core is not None else {}
        s["consumer_wait_ms"] = self._wait_ns / 1e6
        s["batches_yielded"] = self._batches
        return s

    def digest(self):
        """XXH3-64 (16 hex digits) of every batch the C loader handed out since it (re)started, in order:
        what ``ringtrain loadbench --digest`` prints for the same options and batch count. On a GPU, in the
        middle of an epoch, it includes the batch being copied ahead. Needs ``Loader(..., digest=True)``."""
        return self._core.digest()

    def close(self):
        """Stop the loader's threads. Batches already yielded stay valid until freed."""
        self._closed = True
        self._drop_core()

    # ---- pickle and copy: a new loader with the same arguments, at the same position ------------
    def __getstate__(self):
        return {"args": self._args, "state": self.state_dict(), "resumed": self._resumed}

    def __setstate__(self, st):
        self.__init__(**st["args"])
        self.load_state_dict(st["state"])
        self._resumed = st["resumed"]  # the next iteration is the one the original would run

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        c, h, w = self.shape
        return (f"ringtrain.Loader({self.data!r}, batch_size={self.batch_size}, split={self.split!r}, "
                f"rank {self.rank} of {self.world_size}, {self._steps} batches/epoch of {c}x{h}x{w}, "
                f"device={str(self.device)!r})")
