"""Transaction scheduling: when each flash operation runs on its die and channel.

The lowest layer (MQSim's transaction scheduling unit, simplified). A die is the unit
of parallelism (planes are not modelled separately: without multi-plane commands they
only add capacity). Dies are striped over channels: die ``d`` is on channel
``d % channels``.

Two classes of work share a die, with **read priority** as in real controllers:

* *foreground* reads (host cache misses and the write log's merge reads) queue FIFO
  among themselves on the die, then on the channel for the transfer out;
* *background* work (log-flush programs, dirty write-backs, GC copies and erases) is
  a per-die backlog that drains whenever the die has no foreground work. A read
  arriving while background work runs waits for the operation in progress (the
  backlog is taken as whole page programs; no program/erase suspension), then goes
  first; the rest of the backlog resumes after it.

A merge read is a foreground read as in SkyByte's artifact (ftl.cc
``ssd_advance_status``: a flush's NAND_READ takes the die's normal timeline plus the
rest of the flush program in progress; the flush's programs have their own timeline,
pushed back by each read), not work queued behind the programs the flush issued.

Reads are booked when the controller processes them, and a log compaction books its
whole chain of merge reads when it starts, each at the time the flush will reach its
page: up to milliseconds ahead. A read issued earlier than a booked one does not wait
for it (the die serves reads as they arrive; the later one has not been issued yet):
it goes into the first gap before it that fits, waiting for the rest of the program in
progress there (the artifact's ``(flush end - now) mod program time``). Before this
rule, a host read of tpcc waited up to 5.9 ms for merge reads booked ahead of it
(docs/firmware.md, "Reads and the merge reads booked ahead").

Channel transfers (``transfer_ns`` per page, 0 by default) are booked in issue order
per channel (a busy-until time, not a gap-filling reservation), which slightly
over-estimates contention; background transfers are folded into the backlog.

A background operation's completion time is an estimate made when it is queued
(later host reads can push it back); the controller uses it for the write log's
"flush done" time.

Each die has its own read/program/erase times: the base timings (the profile's,
or a ``flash-latency`` knob's) times the die's factor (1, or a ``die-fault`` knob's
slow-down); the channel transfer is not scaled.
"""

from __future__ import annotations

import bisect

#: foreground operations a die remembers for the gaps between them (the oldest go first;
#: ours: a bound on memory, far above the few a die has booked ahead at once)
MAX_BOOKED = 64


class FlashTimeline:
    """Per-die and per-channel timing of ``channels x dies_per_channel`` dies (ns)."""

    def __init__(
        self,
        channels: int,
        dies_per_channel: int,
        read_ns: int,
        program_ns: int,
        erase_ns: int,
        transfer_ns: int = 0,
    ) -> None:
        self.channels = channels
        self.n_dies = channels * dies_per_channel
        self._base_ns = {"read_ns": read_ns, "program_ns": program_ns, "erase_ns": erase_ns}
        self.transfer_ns = transfer_ns
        self.die_factor = [1.0] * self.n_dies  # latency multiplier of each die
        # plain lists: scalar indexing of lists is several times faster than numpy's
        self.die_read_ns: list[int] = []
        self.die_program_ns: list[int] = []
        self.die_erase_ns: list[int] = []
        self._retime()
        self.fg_busy_ns = [0] * self.n_dies  # end of the last foreground read
        # each die's foreground work booked and not over by the latest host read, in
        # time order: (start, end); a read issued before one of them may fit in a gap
        # (vCPUs' clocks differ a little: a lagging vCPU's read no longer sees work that
        # ended before a leading one's read)
        self._booked: list[list[tuple[int, int]]] = [[] for _ in range(self.n_dies)]
        self.bg_backlog_ns = [0] * self.n_dies  # background work not yet done ...
        self.bg_clock_ns = [0] * self.n_dies  # ... as of this time
        self.bg_end_ns = [0] * self.n_dies  # its estimated end when last queued
        self.channel_busy_ns = [0] * channels

    def _retime(self) -> None:
        for name in ("read_ns", "program_ns", "erase_ns"):
            base = self._base_ns[name]
            setattr(self, f"die_{name}", [round(base * f) for f in self.die_factor])

    @property
    def read_ns(self) -> int:
        """The base page read time (a die's is this times its factor)."""
        return self._base_ns["read_ns"]

    @property
    def program_ns(self) -> int:
        return self._base_ns["program_ns"]

    @property
    def erase_ns(self) -> int:
        return self._base_ns["erase_ns"]

    def set_timings(self, **base_ns: int) -> None:
        """Change base timings (``read_ns=...``, ``program_ns``, ``erase_ns``) from now on."""
        unknown = set(base_ns) - set(self._base_ns)
        if unknown:
            raise ValueError(f"unknown flash timing(s) {sorted(unknown)}")
        self._base_ns.update(base_ns)
        self._retime()

    def set_die_factor(self, dies: list[int], factor: float) -> None:
        """Scale the array times of ``dies`` by ``factor`` (1 restores) from now on;
        work already queued keeps the time it was queued with."""
        for die in dies:
            self.die_factor[die] = factor
        self._retime()

    def _drain(self, die: int, time_ns: int) -> None:
        """Advance die ``die``'s background backlog to ``time_ns``."""
        idle_from = max(self.bg_clock_ns[die], self.fg_busy_ns[die])
        if time_ns > idle_from:
            self.bg_backlog_ns[die] = max(0, self.bg_backlog_ns[die] - (time_ns - idle_from))
        if time_ns > self.bg_clock_ns[die]:
            self.bg_clock_ns[die] = time_ns

    def backlog_ns(self, die: int, time_ns: int) -> int:
        """Background work of ``die`` still to do at ``time_ns``."""
        self._drain(die, time_ns)
        return self.bg_backlog_ns[die]

    def _gap(self, die: int, time_ns: int) -> int | None:
        """When a read issued at ``time_ns`` can start in a gap before the foreground
        work booked later on ``die``, or None (it queues behind all of it)."""
        read_ns = self.die_read_ns[die]
        # the rest of the background program in progress, as the artifact's read during
        # a flush: the backlog's end as estimated when it was queued (the drained state is
        # as of the work booked ahead), modulo a program; the reads in between, which
        # pause the programs, shift it by a few microseconds: not modelled
        bg_end = self.bg_end_ns[die]
        start = time_ns + ((bg_end - time_ns) % self.die_program_ns[die] if bg_end > time_ns else 0)
        for begin, end in self._booked[die]:
            if end <= start:
                continue
            if start + read_ns <= begin:
                return start
            start = end
        return None

    def read(self, die: int, time_ns: int, present: bool = True) -> int:
        """A page read (a host miss or a merge read) issued at ``time_ns``; returns when
        its data is out. ``present``: ``time_ns`` is the present (a host read), so work
        over by then is forgotten; a merge read's time is the flush's, ahead of it."""
        booked = self._booked[die]
        if present:
            over = 0
            while over < len(booked) and booked[over][1] <= time_ns:
                over += 1
            if over:
                del booked[:over]
        if booked and self.fg_busy_ns[die] > time_ns:
            start = self._gap(die, time_ns)
            if start is not None:  # before work booked ahead of it (no channel booking)
                done = start + self.die_read_ns[die] + self.transfer_ns
                bisect.insort(booked, (start, done))
                return done
        # _drain(die, time_ns), written out: this is on every cache miss
        fg_busy = self.fg_busy_ns[die]
        bg_clock = self.bg_clock_ns[die]
        backlog = self.bg_backlog_ns[die]
        idle_from = bg_clock if bg_clock > fg_busy else fg_busy
        if time_ns > idle_from:
            backlog = max(0, backlog - (time_ns - idle_from))
        if time_ns > bg_clock:
            bg_clock = time_ns
        if fg_busy > time_ns:
            start = fg_busy
        else:
            # wait for the background operation in progress, not for the whole backlog
            # (the backlog is taken as whole page programs, the common background op)
            program_ns = self.die_program_ns[die]
            wait = backlog % program_ns or min(backlog, program_ns)
            backlog -= wait
            start = time_ns + wait
            bg_clock = start
        self.bg_backlog_ns[die] = backlog
        self.bg_clock_ns[die] = bg_clock
        done = start + self.die_read_ns[die]
        if self.transfer_ns:
            channel = die % self.channels
            done = max(done, self.channel_busy_ns[channel]) + self.transfer_ns
            self.channel_busy_ns[channel] = done
        self.fg_busy_ns[die] = done  # the die's page register holds the data until then
        self._book(die, start, done)
        return done

    def _book(self, die: int, start_ns: int, end_ns: int) -> None:
        """Remember foreground work booked last on ``die`` (bounded: a die that only
        merge reads or GC go to has no host read to forget what is over)."""
        booked = self._booked[die]
        booked.append((start_ns, end_ns))
        if len(booked) > MAX_BOOKED:
            del booked[0]

    def background(self, die: int, time_ns: int, work_ns: int) -> int:
        """Queue ``work_ns`` of background work on ``die``; returns its estimated end."""
        self._drain(die, time_ns)
        self.bg_backlog_ns[die] += work_ns
        end = max(time_ns, self.fg_busy_ns[die]) + self.bg_backlog_ns[die]
        self.bg_end_ns[die] = end
        return end

    def idle(self, time_ns: int) -> int:
        """Forget every operation booked or queued on any die or channel as of
        ``time_ns``, as if the device started idle then; returns the time each die was
        to stay busy, summed over dies (ns). SkyByte's artifact measures in a run of its
        own after the warm-up run (main.cc), on units that start idle."""
        dropped = 0
        for die in range(self.n_dies):
            self._drain(die, time_ns)
            # busy until the last of its work ends (a compaction books its chain ahead:
            # its backlog is drained as of the time its last program was queued)
            busy_until = max(self.fg_busy_ns[die], self.bg_end_ns[die],
                             self.bg_clock_ns[die] + self.bg_backlog_ns[die])
            dropped += max(0, busy_until - time_ns)
            self.bg_backlog_ns[die] = 0
            self.bg_clock_ns[die] = time_ns
            self.bg_end_ns[die] = min(self.bg_end_ns[die], time_ns)
            self.fg_busy_ns[die] = min(self.fg_busy_ns[die], time_ns)
            self._booked[die].clear()
        self.channel_busy_ns[:] = [min(busy, time_ns) for busy in self.channel_busy_ns]
        return dropped

    def program(self, die: int, time_ns: int) -> int:
        """A page program (transfer in + array program), background."""
        return self.background(die, time_ns, self.transfer_ns + self.die_program_ns[die])

    def occupy(self, die: int, time_ns: int, work_ns: int) -> int:
        """Queue ``work_ns`` on ``die`` as foreground work: reads issued later wait for
        all of it (FIFO, as SkyByte's artifact times GC); returns its end."""
        self._drain(die, time_ns)
        start = max(self.fg_busy_ns[die], time_ns)
        self.fg_busy_ns[die] = start + work_ns
        self._book(die, start, start + work_ns)
        return self.fg_busy_ns[die]

    def gc_work_ns(self, die: int, *, copies: int = 0, reads_out: int = 0, programs_in: int = 0,
                   erases: int = 0) -> int:
        """What GC asks of ``die``: on-die copies (read + program, no channel use), reads
        of pages leaving it (read + transfer out), programs of pages coming in
        (transfer in + program), block erases."""
        read, program, transfer = self.die_read_ns[die], self.die_program_ns[die], self.transfer_ns
        return (copies * (read + program) + reads_out * (read + transfer)
                + programs_in * (transfer + program) + erases * self.die_erase_ns[die])
