// SPDX-License-Identifier: GPL-2.0
/*
 * cxlssd_helper - the guest kernel helper of the cxlssd platform (issue 14, docs/host-os.md).
 *
 * Foundation only: it finds the paravirtual page (the BAR 2 of the ivshmem-plain device
 * whose first word is CXLSSD_PV_MAGIC) and notices "long delay" answers of the firmware
 * there, by one of two paths whose skid (guest instructions between the long access and
 * the kernel's reaction) tools/experiments measure:
 *
 *   - poll_ns=N: a pinned hrtimer per CPU reads its vCPU's pv slot every N ns of guest
 *     time. Under -icount shift=0 guest time is 1 ns per instruction, so N bounds the
 *     skid in instructions deterministically (plus the interrupt's entry).
 *   - an ivshmem-doorbell device (PCI 1af4:1110 with MSI-X): its vector 0 is rung by the
 *     host (an eventfd, QEMU's main loop, MSI-X); the handler reads the slot.
 *
 * Transparent context switching: the plugin rings the doorbell on a long-delay answer to
 * a device read of a user thread and holds the vCPU until QEMU took the ring; the handler
 * parks the interrupted thread if another can run (park_current: SWITCH, yield, RESUME).
 *
 * Threads in the request stream: a probe on the sched_switch tracepoint writes the pid of
 * the task a CPU switches to into its vCPU's pv slot (`thread`); the plugin tags every
 * device request with it, so a recorded trace carries the guest thread.
 *
 * While /dev/cxlssd_helper is open, each reaction is an event (guest TSC, ticket, source,
 * CPU) that the reader gets (read blocks until one is there; poll works): the skid probe
 * matches events to its own accesses. Under -icount the TSC counts instructions, so TSC
 * differences are instruction counts. /sys/class/misc/cxlssd_helper/stats has the counts.
 * Unloading stops the timers, frees the vector and the mapping, and wakes every reader
 * (it then gets EOF).
 *
 * Promotion driven by the guest's execution: the plugin rings the doorbell's vector 1 when
 * the firmware's mailbox got decisions (it looks at fixed points of the vCPU's modelled
 * time, after the firmware served everything before them); the handler wakes the
 * promotion daemon blocked in read(2) of /dev/cxlssd_promote, which carries the decisions
 * out with move_pages(2) (the kernel does not export migrate_pages to modules). A read
 * returns the rings so far (u64) once there was one since the file's last read; the open
 * file holds the module (unloading is refused while the daemon runs). Its ioctl
 * CXLSSD_PROMOTE_WHERE (cxlssd_promote.h) tells the daemon where the program maps the page
 * a decision names, so the daemon need not read the program's whole page map for it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpu.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/hrtimer.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/memory_hotplug.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/pci.h>
#include <linux/percpu.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/sched/stat.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/task_work.h>
#include <linux/tracepoint.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <asm/irq_regs.h>
#include <asm/msr.h>

#include "cxlssd_abi.h"
#include "cxlssd_promote.h"

#define IVSHMEM_VENDOR 0x1af4
#define IVSHMEM_DEVICE 0x1110
#define IVSHMEM_SHM_BAR 2
#define EVENT_SLOTS 4096u /* a power of 2 */
#define POLL_MIN_NS 1000ul

enum cxlssd_helper_source { SOURCE_TIMER = 1, SOURCE_DOORBELL = 2, SOURCE_PARK = 3, SOURCE_RESUMED = 4 };

/* One reaction, as read(2) returns it (little-endian, 32 bytes). */
struct cxlssd_helper_event {
	u64 tsc;	/* guest TSC when the kernel saw the answer */
	u64 ticket;	/* the slot's query_ticket */
	u64 ready_ns;	/* the slot's query_ready_ns */
	u32 source;	/* enum cxlssd_helper_source */
	u32 cpu;
};

static unsigned long poll_ns;
module_param(poll_ns, ulong, 0444);
MODULE_PARM_DESC(poll_ns, "poll each vCPU's pv slot every N ns of guest time (0: off; >= 1000)");

static bool switching = true;
module_param(switching, bool, 0444);
MODULE_PARM_DESC(switching, "park a user thread that got a long delay when another thread can run (default on)");

struct helper_cpu {
	struct hrtimer timer;
	u64 last_ticket;
	bool started;
};

static DEFINE_PER_CPU(struct helper_cpu, helper_cpus);

static struct {
	void *pv; /* the paravirtual page, or NULL */
	struct pci_dev *pv_dev;
	struct pci_dev *doorbell;
	bool doorbell_irq;
	spinlock_t lock;
	struct cxlssd_helper_event events[EVENT_SLOTS];
	u64 head, tail; /* under lock */
	wait_queue_head_t readers;
	bool stopping;
	atomic_t open_files; /* open files of /dev/cxlssd_helper: events are queued only for them */
	atomic64_t ticks, doorbells, reactions, dropped, parks, not_parked;
	/* vector 1: promotion decisions in the mailbox */
	bool promote_irq;
	wait_queue_head_t promoters;
	atomic64_t promote_rings;
	/* The task that last opened /dev/cxlssd_promote (the daemon), compared against in
	 * sched_switch's probe, never dereferenced; NULL when its file is closed. */
	struct task_struct *promoter;
	atomic64_t daemon_switches; /* DAEMON_OFF markers: the daemon left its CPU */
} helper;

static struct cxlssd_pv_slot *pv_slot(unsigned int cpu)
{
	const struct cxlssd_pv_header *header = helper.pv;

	if (!header || cpu >= READ_ONCE(header->slots))
		return NULL;
	return (struct cxlssd_pv_slot *)((char *)helper.pv + header->slot_offset +
					 (size_t)cpu * header->slot_bytes);
}

/* A marker (docs/plugin.md): the plugin sees it when this CPU executes it. */
#define HELPER_MARKER(cmd, id) \
	asm volatile(".byte 0x0f,0x1f,0x84,0x00\n\t.long %c0" :: "i"(CXLSSD_MARKER_DISP((cmd), (id))) : "memory")

static void record(u64 tsc, const struct cxlssd_pv_slot *slot, u64 ticket, u32 source)
{
	struct cxlssd_helper_event *event;
	unsigned long flags;

	if (!atomic_read(&helper.open_files))
		return; /* nobody reads them: no instructions spent on the vCPU */
	spin_lock_irqsave(&helper.lock, flags);
	if (helper.head - helper.tail >= EVENT_SLOTS) {
		spin_unlock_irqrestore(&helper.lock, flags);
		atomic64_inc(&helper.dropped);
		return;
	}
	event = &helper.events[helper.head % EVENT_SLOTS];
	event->tsc = tsc;
	event->ticket = ticket;
	event->ready_ns = slot ? READ_ONCE(slot->query_ready_ns) : 0;
	event->source = source;
	event->cpu = raw_smp_processor_id();
	helper.head++;
	spin_unlock_irqrestore(&helper.lock, flags);
	atomic64_inc(&helper.reactions);
	wake_up_interruptible(&helper.readers);
}

/* A new long-delay answer in this CPU's slot since the last look: record it. */
static void check_slot(u64 tsc, u32 source)
{
	struct helper_cpu *me = this_cpu_ptr(&helper_cpus);
	const struct cxlssd_pv_slot *slot = pv_slot(smp_processor_id());
	u64 ticket;

	if (!slot)
		return;
	ticket = READ_ONCE(slot->query_ticket); /* written last by the firmware */
	if (ticket == me->last_ticket)
		return;
	me->last_ticket = ticket;
	smp_rmb();
	if (READ_ONCE(slot->query_long))
		record(tsc, slot, ticket, source);
}

static enum hrtimer_restart poll_tick(struct hrtimer *timer)
{
	u64 tsc = rdtsc_ordered();

	atomic64_inc(&helper.ticks);
	check_slot(tsc, SOURCE_TIMER);
	hrtimer_forward_now(timer, ns_to_ktime(poll_ns));
	return HRTIMER_RESTART;
}

static void start_poll(void *unused)
{
	struct helper_cpu *me = this_cpu_ptr(&helper_cpus);
	const struct cxlssd_pv_slot *slot = pv_slot(smp_processor_id());

	me->last_ticket = slot ? READ_ONCE(slot->query_ticket) : 0;
	hrtimer_init(&me->timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL_PINNED_HARD);
	me->timer.function = poll_tick;
	me->started = true;
	hrtimer_start(&me->timer, ns_to_ktime(poll_ns), HRTIMER_MODE_REL_PINNED_HARD);
}

static void stop_polls(void)
{
	unsigned int cpu;

	for_each_possible_cpu(cpu) {
		struct helper_cpu *state = per_cpu_ptr(&helper_cpus, cpu);

		if (state->started) {
			hrtimer_cancel(&state->timer);
			state->started = false;
		}
	}
}

struct park_work {
	struct callback_head head;
	u64 ticket;
};

/*
 * Runs in the thread that got the long delay, on its way back to user space (a task_work):
 * the switch. SWITCH (the firmware parks the read's latency under its ticket), then yield:
 * the thread goes behind the other runnable threads and the scheduler runs one of them.
 * When the scheduler comes back to it, RESUME with the ticket: the firmware charges what
 * is left of the latency, max(0, ready - now). This is the round-robin of the guest
 * runtime's tasks and of the replay's thread model, triggered by the kernel: the thread
 * never sleeps, so nothing can leave it parked (a firmware that died just stops the
 * rings). A pending park holds a module reference.
 */
static void park_current(struct callback_head *head)
{
	struct park_work *work = container_of(head, struct park_work, head);
	u64 ticket = work->ticket;
	struct cxlssd_pv_slot *slot;

	kfree(work);
	record(rdtsc_ordered(), NULL, ticket, SOURCE_PARK);
	preempt_disable();
	HELPER_MARKER(CXLSSD_CMD_SWITCH, CXLSSD_SWITCH_KERNEL);
	preempt_enable();
	yield();
	preempt_disable();
	slot = pv_slot(smp_processor_id());
	if (slot) {
		WRITE_ONCE(slot->arg0, ticket);
		HELPER_MARKER(CXLSSD_CMD_RESUME, 0);
	}
	preempt_enable();
	record(rdtsc_ordered(), NULL, ticket, SOURCE_RESUMED);
	atomic64_inc(&helper.parks);
	module_put(THIS_MODULE);
}

/* A long delay of the interrupted thread: park it if it is a user thread and another
 * thread can run here (with one, there is nothing to switch to: the read's latency is
 * charged in full, as without the helper). */
static void queue_park(u64 ticket)
{
	struct park_work *work;

	if (!switching || !user_mode(get_irq_regs()) || (current->flags & PF_KTHREAD) ||
	    single_task_running()) {
		atomic64_inc(&helper.not_parked);
		return;
	}
	if (!try_module_get(THIS_MODULE))
		return;
	work = kmalloc(sizeof(*work), GFP_ATOMIC);
	if (!work)
		goto put;
	work->ticket = ticket;
	init_task_work(&work->head, park_current);
	if (!task_work_add(current, &work->head, TWA_RESUME))
		return;
	kfree(work);
put:
	module_put(THIS_MODULE);
}

static irqreturn_t doorbell_irq(int irq, void *data)
{
	u64 tsc = rdtsc_ordered();
	const struct cxlssd_pv_slot *slot = pv_slot(smp_processor_id());
	u64 ticket = slot ? READ_ONCE(slot->query_ticket) : 0;

	atomic64_inc(&helper.doorbells);
	/* The doorbell says "look now": record even a ticket the timer already saw. */
	record(tsc, slot, ticket, SOURCE_DOORBELL);
	queue_park(ticket);
	return IRQ_HANDLED;
}

/* ---- the ivshmem-doorbell device (MSI-X) ------------------------------------------- */

/* Vector 1: the mailbox got decisions. Wake the promotion daemon. */
static irqreturn_t promote_irq(int irq, void *data)
{
	atomic64_inc(&helper.promote_rings);
	wake_up_interruptible(&helper.promoters);
	return IRQ_HANDLED;
}

static int doorbell_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	int err, vectors;

	/* ivshmem-plain (the pv page) has no MSI-X: leave it to user space's resource2. */
	if (!pci_find_capability(pdev, PCI_CAP_ID_MSIX))
		return -ENODEV;
	if (helper.doorbell) {
		dev_info(&pdev->dev, "a second ivshmem-doorbell device: ignored\n");
		return -EBUSY;
	}
	err = pci_enable_device(pdev);
	if (err)
		return err;
	/* QEMU sends an MSI as a write on the device's bus-master address space. */
	pci_set_master(pdev);
	vectors = pci_alloc_irq_vectors(pdev, 1, 2, PCI_IRQ_MSIX);
	if (vectors < 0) {
		err = vectors;
		dev_err(&pdev->dev, "cannot allocate its MSI-X vectors (%d)\n", err);
		goto disable;
	}
	err = request_irq(pci_irq_vector(pdev, 0), doorbell_irq, 0, KBUILD_MODNAME, pdev);
	if (err) {
		dev_err(&pdev->dev, "cannot request its MSI-X interrupt (%d)\n", err);
		goto vectors;
	}
	/* Without vector 1 (a device of one vector) the daemon polls the mailbox itself. */
	helper.promote_irq = vectors > 1 &&
			     !request_irq(pci_irq_vector(pdev, 1), promote_irq, 0, KBUILD_MODNAME "-promote", pdev);
	helper.doorbell = pdev;
	dev_info(&pdev->dev, "ivshmem-doorbell: vector 0 on irq %d, promotion %s\n", pci_irq_vector(pdev, 0),
		 helper.promote_irq ? "on vector 1" : "not rung (no vector 1)");
	return 0;
vectors:
	pci_free_irq_vectors(pdev);
disable:
	pci_clear_master(pdev);
	pci_disable_device(pdev);
	return err;
}

static void doorbell_remove(struct pci_dev *pdev)
{
	if (helper.doorbell != pdev)
		return;
	if (helper.promote_irq)
		free_irq(pci_irq_vector(pdev, 1), pdev);
	helper.promote_irq = false;
	free_irq(pci_irq_vector(pdev, 0), pdev);
	pci_free_irq_vectors(pdev);
	pci_clear_master(pdev);
	pci_disable_device(pdev);
	helper.doorbell = NULL;
}

static const struct pci_device_id doorbell_ids[] = {
	{ PCI_DEVICE(IVSHMEM_VENDOR, IVSHMEM_DEVICE) },
	{ }
};
/* No MODULE_DEVICE_TABLE: the module is insmod-ed by the platform, never autoloaded. */

static struct pci_driver doorbell_driver = {
	.name = KBUILD_MODNAME,
	.id_table = doorbell_ids,
	.probe = doorbell_probe,
	.remove = doorbell_remove,
};

/* ---- the paravirtual page ----------------------------------------------------------- */

static void map_pv_page(void)
{
	struct pci_dev *pdev = NULL;

	while ((pdev = pci_get_device(IVSHMEM_VENDOR, IVSHMEM_DEVICE, pdev))) {
		resource_size_t start = pci_resource_start(pdev, IVSHMEM_SHM_BAR);
		void *page;

		if (!start || pci_resource_len(pdev, IVSHMEM_SHM_BAR) < CXLSSD_PV_BYTES)
			continue;
		/* Not requested: user space (libcxlssd, the daemon) maps it through resource2. */
		page = memremap(start, CXLSSD_PV_BYTES, MEMREMAP_WB);
		if (!page)
			continue;
		if (READ_ONCE(*(u64 *)page) == CXLSSD_PV_MAGIC) {
			helper.pv = page;
			helper.pv_dev = pdev; /* keeps the reference */
			return;
		}
		memunmap(page);
	}
}

/* ---- /dev/cxlssd_helper -------------------------------------------------------------- */

static bool readable(void)
{
	bool ready;

	spin_lock_irq(&helper.lock);
	ready = helper.head != helper.tail || helper.stopping;
	spin_unlock_irq(&helper.lock);
	return ready;
}

static ssize_t helper_read(struct file *file, char __user *buf, size_t count, loff_t *pos)
{
	struct cxlssd_helper_event batch[16];
	size_t n = 0, max = min_t(size_t, count / sizeof(batch[0]), ARRAY_SIZE(batch));
	int err;

	if (max == 0)
		return -EINVAL;
	if (!(file->f_flags & O_NONBLOCK)) {
		err = wait_event_interruptible(helper.readers, readable());
		if (err)
			return err;
	}
	spin_lock_irq(&helper.lock);
	while (n < max && helper.tail != helper.head)
		batch[n++] = helper.events[helper.tail++ % EVENT_SLOTS];
	spin_unlock_irq(&helper.lock);
	if (n == 0)
		return helper.stopping ? 0 : -EAGAIN;
	if (copy_to_user(buf, batch, n * sizeof(batch[0])))
		return -EFAULT;
	return n * sizeof(batch[0]);
}

static __poll_t helper_poll(struct file *file, poll_table *wait)
{
	poll_wait(file, &helper.readers, wait);
	return readable() ? EPOLLIN | EPOLLRDNORM : 0;
}

static int helper_open(struct inode *inode, struct file *file)
{
	atomic_inc(&helper.open_files);
	return 0;
}

static int helper_release(struct inode *inode, struct file *file)
{
	atomic_dec(&helper.open_files);
	return 0;
}

static const struct file_operations helper_fops = {
	.owner = THIS_MODULE,
	.open = helper_open,
	.release = helper_release,
	.read = helper_read,
	.poll = helper_poll,
	.llseek = noop_llseek,
};

/* ---- /dev/cxlssd_promote: the promotion daemon waits here ------------------------------ */

static bool promote_ready(const u64 *seen)
{
	return atomic64_read(&helper.promote_rings) != *seen || READ_ONCE(helper.stopping);
}

static int promote_open(struct inode *inode, struct file *file)
{
	u64 *seen = kmalloc(sizeof(*seen), GFP_KERNEL);

	if (!seen)
		return -ENOMEM;
	*seen = atomic64_read(&helper.promote_rings);
	file->private_data = seen;
	WRITE_ONCE(helper.promoter, current);
	return 0;
}

static int promote_release(struct inode *inode, struct file *file)
{
	cmpxchg(&helper.promoter, current, NULL);
	kfree(file->private_data);
	return 0;
}

static ssize_t promote_read(struct file *file, char __user *buf, size_t count, loff_t *pos)
{
	u64 *seen = file->private_data, rings;
	int err;

	if (count < sizeof(rings))
		return -EINVAL;
	if (!(file->f_flags & O_NONBLOCK)) {
		err = wait_event_interruptible(helper.promoters, promote_ready(seen));
		if (err)
			return err;
	}
	rings = atomic64_read(&helper.promote_rings);
	if (rings == *seen)
		return READ_ONCE(helper.stopping) ? 0 : -EAGAIN;
	*seen = rings;
	if (copy_to_user(buf, &rings, sizeof(rings)))
		return -EFAULT;
	return sizeof(rings);
}

static __poll_t promote_poll(struct file *file, poll_table *wait)
{
	poll_wait(file, &helper.promoters, wait);
	return promote_ready(file->private_data) ? EPOLLIN | EPOLLRDNORM : 0;
}

/* The virtual pages of `mm` that may map `page`: the reverse map's arithmetic (a page's
 * offset in its anonymous or file mapping against each VMA's offset), over this one
 * process's VMAs. Nothing is pinned: the daemon checks each answer against the page map. */
static u32 where_mapped(struct mm_struct *mm, struct page *page, u64 *va)
{
	struct folio *folio = page_folio(page);
	const unsigned long mapping = (unsigned long)READ_ONCE(folio->mapping);
	const bool anon = mapping & PAGE_MAPPING_ANON;
	const pgoff_t pgoff = page_to_pgoff(page);
	struct vm_area_struct *vma;
	u32 found = 0;
	VMA_ITERATOR(vmi, mm, 0);

	for_each_vma(vmi, vma) {
		if (anon ? !vma->anon_vma
			 : !vma->vm_file || (unsigned long)vma->vm_file->f_mapping != mapping)
			continue;
		if (pgoff < vma->vm_pgoff || pgoff - vma->vm_pgoff >= vma_pages(vma))
			continue;
		va[found++] = vma->vm_start + ((pgoff - vma->vm_pgoff) << PAGE_SHIFT);
		if (found == CXLSSD_WHERE_MAX)
			break;
	}
	return found;
}

static long promote_where(struct cxlssd_where __user *arg)
{
	struct cxlssd_where where;
	struct task_struct *task;
	struct mm_struct *mm;
	struct folio *folio;
	struct page *page;
	struct pid *pid;

	if (copy_from_user(&where, arg, sizeof(where)))
		return -EFAULT;
	page = pfn_to_online_page(where.pfn);
	if (!page)
		return -EINVAL;
	folio = page_folio(page);
	if (folio_test_ksm(folio) || folio_test_hugetlb(folio))
		return -EOPNOTSUPP; /* their offset is not the reverse map's */
	pid = find_get_pid(where.pid);
	task = get_pid_task(pid, PIDTYPE_PID);
	put_pid(pid);
	if (!task)
		return -ESRCH;
	mm = get_task_mm(task);
	put_task_struct(task);
	if (!mm)
		return -ESRCH;
	where.found = 0;
	if (folio_mapped(folio)) { /* (an unmapped page: no process has it) */
		if (mmap_read_lock_killable(mm)) {
			mmput(mm);
			return -EINTR;
		}
		where.found = where_mapped(mm, page, where.va);
		mmap_read_unlock(mm);
	}
	mmput(mm);
	return copy_to_user(arg, &where, sizeof(where)) ? -EFAULT : 0;
}

static long promote_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	if (cmd != CXLSSD_PROMOTE_WHERE)
		return -ENOTTY;
	return promote_where((struct cxlssd_where __user *)arg);
}

static const struct file_operations promote_fops = {
	.owner = THIS_MODULE,
	.open = promote_open,
	.release = promote_release,
	.read = promote_read,
	.poll = promote_poll,
	.unlocked_ioctl = promote_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice promote_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "cxlssd_promote",
	.fops = &promote_fops,
	.mode = 0600,
};

static ssize_t stats_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "pv %d poll_ns %lu doorbell %d switching %d ticks %lld doorbells %lld reactions %lld "
			  "dropped %lld parks %lld not_parked %lld promote_irq %d promote_rings %lld daemon_switches %lld\n",
			  helper.pv != NULL, poll_ns, helper.doorbell != NULL, switching,
			  atomic64_read(&helper.ticks), atomic64_read(&helper.doorbells),
			  atomic64_read(&helper.reactions), atomic64_read(&helper.dropped),
			  atomic64_read(&helper.parks), atomic64_read(&helper.not_parked),
			  helper.promote_irq, atomic64_read(&helper.promote_rings),
			  atomic64_read(&helper.daemon_switches));
}
static DEVICE_ATTR_RO(stats);

static struct attribute *helper_attrs[] = { &dev_attr_stats.attr, NULL };
ATTRIBUTE_GROUPS(helper);

static struct miscdevice helper_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "cxlssd_helper",
	.fops = &helper_fops,
	.groups = helper_groups,
	.mode = 0600,
};

/* ---- the running thread, for the request stream ------------------------------------- */

static struct tracepoint *sched_switch_tp; /* registered with note_switch, or NULL */

static void note_thread(struct task_struct *task)
{
	struct cxlssd_pv_slot *slot = pv_slot(smp_processor_id());

	if (slot)
		WRITE_ONCE(slot->thread, task->pid);
}

/* sched_switch's probe (TP_PROTO of include/trace/events/sched.h). The promotion daemon
 * runs SCHED_FIFO, yet move_pages(2) blocks inside its looks (lru_cache_disable waits for
 * an RCU grace period) and the program runs meanwhile: the firmware takes back only the
 * daemon's own time in a look (firmware/hints.py), so it is told when the daemon leaves
 * its CPU and gets back (each marker is tagged with the daemon's pid). */
static void note_switch(void *data, bool preempt, struct task_struct *prev, struct task_struct *next,
			unsigned int prev_state)
{
	struct task_struct *daemon = READ_ONCE(helper.promoter);

	if (daemon && prev == daemon && next != daemon) {
		HELPER_MARKER(CXLSSD_CMD_DAEMON, CXLSSD_DAEMON_OFF);
		atomic64_inc(&helper.daemon_switches);
	}
	note_thread(next);
	if (daemon && next == daemon && prev != daemon)
		HELPER_MARKER(CXLSSD_CMD_DAEMON, CXLSSD_DAEMON_ON);
}

static void note_current(void *unused)
{
	note_thread(current);
}

static void forget_thread(void *unused)
{
	struct cxlssd_pv_slot *slot = pv_slot(smp_processor_id());

	if (slot)
		WRITE_ONCE(slot->thread, 0);
}

/* The kernel does not export the tracepoint itself to modules, only the lookup. */
static void find_sched_switch(struct tracepoint *tp, void *found)
{
	if (!strcmp(tp->name, "sched_switch"))
		*(struct tracepoint **)found = tp;
}

static void start_thread_notes(void)
{
	struct tracepoint *tp = NULL;
	int err;

	if (!helper.pv)
		return;
	for_each_kernel_tracepoint(find_sched_switch, &tp);
	err = tp ? tracepoint_probe_register(tp, (void *)note_switch, NULL) : -ENOENT;
	if (err) {
		pr_warn("no sched_switch tracepoint (%d): requests carry no thread\n", err);
		return;
	}
	sched_switch_tp = tp;
	on_each_cpu(note_current, NULL, 1);
}

static void stop_thread_notes(void)
{
	if (!sched_switch_tp)
		return;
	tracepoint_probe_unregister(sched_switch_tp, (void *)note_switch, NULL);
	tracepoint_synchronize_unregister();
	sched_switch_tp = NULL;
	on_each_cpu(forget_thread, NULL, 1);
}

/* ---- load and unload ------------------------------------------------------------------ */

static void release_pv(void)
{
	if (helper.pv) {
		memunmap(helper.pv);
		helper.pv = NULL;
	}
	pci_dev_put(helper.pv_dev);
	helper.pv_dev = NULL;
}

static int __init helper_init(void)
{
	int err;

	if (poll_ns && poll_ns < POLL_MIN_NS) {
		pr_err("poll_ns=%lu is below %lu: refused\n", poll_ns, POLL_MIN_NS);
		return -EINVAL;
	}
	spin_lock_init(&helper.lock);
	init_waitqueue_head(&helper.readers);
	init_waitqueue_head(&helper.promoters);
	map_pv_page();
	if (!helper.pv && poll_ns) {
		pr_err("poll_ns=%lu but no paravirtual page (an ivshmem BAR 2 starting with the pv magic): "
		       "boot the guest with the platform's plugin\n", poll_ns);
		return -ENODEV;
	}
	err = misc_register(&helper_misc);
	if (err) {
		pr_err("cannot register /dev/%s (%d)\n", helper_misc.name, err);
		goto pv;
	}
	err = misc_register(&promote_misc);
	if (err) {
		pr_err("cannot register /dev/%s (%d)\n", promote_misc.name, err);
		goto misc;
	}
	err = pci_register_driver(&doorbell_driver);
	if (err) {
		pr_err("cannot register the ivshmem-doorbell driver (%d)\n", err);
		goto promote;
	}
	start_thread_notes();
	if (poll_ns) {
		cpus_read_lock();
		on_each_cpu(start_poll, NULL, 1);
		cpus_read_unlock();
	}
	pr_info("loaded: pv page %s, poll every %lu ns%s, doorbell %s, promotion %s, threads %s\n",
		helper.pv ? "found" : "absent", poll_ns, poll_ns ? "" : " (off)",
		helper.doorbell ? pci_name(helper.doorbell) : "absent",
		helper.promote_irq ? "rung" : "polled by the daemon", sched_switch_tp ? "noted" : "not noted");
	return 0;
promote:
	misc_deregister(&promote_misc);
misc:
	misc_deregister(&helper_misc);
pv:
	release_pv();
	return err;
}

static void __exit helper_exit(void)
{
	stop_polls();
	stop_thread_notes();
	pci_unregister_driver(&doorbell_driver);
	spin_lock_irq(&helper.lock);
	helper.stopping = true;
	spin_unlock_irq(&helper.lock);
	wake_up_interruptible_all(&helper.readers);
	wake_up_interruptible_all(&helper.promoters);
	misc_deregister(&promote_misc);
	misc_deregister(&helper_misc); /* open files keep the module: no reader is left here */
	release_pv();
	pr_info("unloaded: %lld ticks, %lld doorbells, %lld reactions, %lld dropped, %lld promotion rings\n",
		atomic64_read(&helper.ticks), atomic64_read(&helper.doorbells),
		atomic64_read(&helper.reactions), atomic64_read(&helper.dropped),
		atomic64_read(&helper.promote_rings));
}

module_init(helper_init);
module_exit(helper_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("cxlssd guest kernel helper: transparent context switching on long-delay answers, promotion wake-ups");
