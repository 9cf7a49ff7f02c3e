/* normcore book, site check: lift the browser's cap of 250 resource timing entries, so that
 * every file a page fetches is timed. An init script calls it; it returns nothing.
 */
() => { performance.setResourceTimingBufferSize(100000); }
