// Why a connection was refused, in the words the CLI uses.
//
// A browser tells a page nothing of a refused WebSocket upgrade (no status, no body), so
// the page reads the same subresource with a plain GET: the server runs the same checks
// before it would dial (who you are, whether you may, whether the machine exists and runs)
// and answers the first that fails with its Status. When every check passes it answers
// that an upgrade was needed, and then only the dial can have failed.

const UPGRADE_NEEDED = /needs a WebSocket upgrade/;

export async function explain(url, headers) {
  let response, status;
  try {
    response = await fetch(url, { headers, cache: 'no-store' });
    status = await response.json();
  } catch {
    return '';
  }
  if (response.ok || !status || status.kind !== 'Status') return '';
  if (status.code === 400 && UPGRADE_NEEDED.test(status.message || '')) {
    return 'the server could not connect to the machine (is its backend up?)';
  }
  if (status.code === 401 && (!status.message || status.message === 'Unauthorized')) {
    return 'error: You must be logged in to the server (Unauthorized)';
  }
  return `Error from server (${status.reason || response.statusText}): ${status.message}`;
}
