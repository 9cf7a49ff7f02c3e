/* normcore book, site check: how long the page took to load. Returns the milliseconds from
 * navigation start to the end of the page's load event (NaN without a navigation entry).
 */
() => { const n = performance.getEntriesByType('navigation')[0];
        return n ? n.loadEventEnd - n.startTime : NaN; }
